//! Leader election ([`Locks::election`](crate::Locks::election)) on a real
//! store: observers follow every change in token order, resigning hands
//! over promptly, a crashed leader is replaced after its ttl, and an
//! announced grant wakes another client's subscribers.

use std::time::Duration;

use tokio::time::{sleep, timeout, Instant};

use super::{grant, key, prefix, request, TestStore, LONG};
use crate::backend::Acquire;
use crate::election::{Leader, Observer};
use crate::lock::{AcquireOptions, Locks};

/// Bound for "an observer notices": seconds, far below the 30 s ttls used,
/// so only a wake-up (or the fallback's short poll while nobody leads) can
/// meet it.
const NOTICE: Duration = Duration::from_secs(5);

async fn next_leader(observer: &mut Observer, what: &str) -> Leader {
    timeout(NOTICE, observer.next())
        .await
        .unwrap_or_else(|_| panic!("the observer did not see {what} within {NOTICE:?}"))
        .expect("store answers")
}

fn campaigning() -> AcquireOptions {
    AcquireOptions::new()
        .with_ttl(LONG)
        .with_wait(Duration::from_secs(20))
}

/// Leaders follow each other, each resigning after a while; an observer
/// started before the first (on another handle, as another process) sees
/// every one, by candidate id and token, in token order. On a store that
/// notifies, the observer runs on its own task, woken by the store while
/// the terms come and go; polling, it looks after each term began (a
/// polling observer looks again only at the leader's expiry, 30 s here).
///
/// On a store that announces, the observer's safety-net poll is set to an
/// hour and each term begins only after the observer has read the key empty
/// (woken by the previous resignation): an observer that sees the new
/// leader within the bound was woken by the grant's announcement, nothing
/// else. (With the default 50 ms poll the property would pass without
/// announcements too.)
pub async fn election_observers_see_every_leader_in_token_order(store: &TestStore) {
    const TERMS: usize = 3;
    let name = format!("{}leader", prefix());
    let watching = Locks::from_arc(store.backend.clone())
        .election(&name)
        .unwrap();
    let woken = store.caps.notifies;
    // Whether the store says it announces: announcing the unheld key is
    // harmless (nobody subscribes yet) and tells.
    let announces = woken
        && store
            .backend
            .announce(&key(name.clone()))
            .await
            .expect("store answers");
    let mut observer = watching.observe().await.unwrap();
    if announces {
        observer = observer.with_safety_poll(Duration::from_secs(3600));
    }
    let (following, mut polling) = if woken {
        let mut observer = observer;
        let task = tokio::spawn(async move {
            let mut seen = Vec::new();
            for i in 0..TERMS {
                seen.push(next_leader(&mut observer, &format!("candidate-{i}")).await);
            }
            seen
        });
        (Some(task), None)
    } else {
        (None, Some(observer))
    };
    let election = store.locks().election(&name).unwrap();
    let mut expected = Vec::new();
    let mut seen = Vec::new();
    for i in 0..TERMS {
        let term = election
            .campaign(&format!("candidate-{i}"), &campaigning())
            .await
            .expect("the key is free");
        expected.push(Leader {
            candidate: format!("candidate-{i}"),
            token: term.token(),
        });
        match polling.as_mut() {
            Some(observer) => seen.push(next_leader(observer, &format!("candidate-{i}")).await),
            // Long enough for a woken observer to look (a round trip or two).
            None => sleep(Duration::from_millis(300)).await,
        }
        assert_eq!(watching.leader().await.unwrap(), expected.last().cloned());
        term.resign().await.unwrap();
        if announces {
            // Let the observer, woken by the release, read the key empty
            // and go back to waiting before the next term begins.
            sleep(Duration::from_millis(300)).await;
        }
    }
    if let Some(task) = following {
        seen = task.await.expect("the observer's task");
    }
    assert_eq!(seen, expected, "every leader, in order");
    assert!(seen.windows(2).all(|w| w[0].token < w[1].token), "{seen:?}");
    assert_eq!(
        watching.leader().await.unwrap(),
        None,
        "the last one resigned"
    );
}

/// A candidate waiting behind a leader (30 s ttl) takes over within
/// seconds of the leader resigning, and an observer already waiting (on a
/// store that notifies; a polling one looks at the leader's expiry) sees
/// it as promptly.
pub async fn election_resign_hands_over_promptly(store: &TestStore) {
    let name = format!("{}leader", prefix());
    let election = store.locks().election(&name).unwrap();
    let first = election.campaign("first", &campaigning()).await.unwrap();
    let mut observer = store
        .locks()
        .election(&name)
        .unwrap()
        .observe()
        .await
        .unwrap();
    assert_eq!(next_leader(&mut observer, "first").await.candidate, "first");
    let woken = store.caps.notifies;
    let watching = tokio::spawn(async move {
        let seen = if woken {
            let leader = next_leader(&mut observer, "second").await;
            Some((leader, Instant::now()))
        } else {
            None
        };
        (seen, observer)
    });
    let challenger = store.locks().election(&name).unwrap();
    let second = tokio::spawn(async move { challenger.campaign("second", &campaigning()).await });
    sleep(Duration::from_millis(300)).await;
    let resigned_at = Instant::now();
    let first_token = first.token();
    first.resign().await.unwrap();
    let second = second.await.unwrap().expect("the challenger is elected");
    let elected_after = resigned_at.elapsed();
    assert!(
        elected_after < NOTICE,
        "elected {elected_after:?} after the resignation"
    );
    let (seen, mut observer) = watching.await.expect("the observer's task");
    let (seen, observed_after) = match seen {
        Some((leader, at)) => (leader, at.saturating_duration_since(resigned_at)),
        None => (next_leader(&mut observer, "second").await, Duration::ZERO),
    };
    assert_eq!(seen.candidate, "second");
    assert_eq!(seen.token, second.token());
    assert!(seen.token > first_token);
    assert!(
        observed_after < NOTICE,
        "hand-over seen {observed_after:?} after the resignation"
    );
    second.resign().await.unwrap();
}

/// A leader that crashed (its lease never renewed nor released) is
/// replaced once its ttl ends, not before; observers see the successor.
pub async fn election_crashed_leader_is_replaced_after_ttl(store: &TestStore) {
    let name = format!("{}leader", prefix());
    let k = key(name.clone());
    let ttl = Duration::from_millis(800);
    // The crashed leader: granted at the store, then abandoned.
    let crashed = match store
        .backend
        .try_acquire(&request(&k, ttl))
        .await
        .expect("store answers")
    {
        Acquire::Granted(lease) => lease,
        other => panic!("a fresh key is not granted: {other:?}"),
    };
    let granted_at = Instant::now();
    let election = store.locks().election(&name).unwrap();
    let mut observer = election.observe().await.unwrap();
    assert_eq!(
        next_leader(&mut observer, "the crashed leader").await.token,
        crashed.token()
    );
    let successor = election
        .campaign("successor", &campaigning())
        .await
        .expect("the successor is elected after the crashed leader's ttl");
    let took = granted_at.elapsed();
    assert!(took >= ttl / 2, "elected {took:?} into a {ttl:?} lease");
    assert!(took < ttl + NOTICE, "elected only after {took:?}");
    let seen = next_leader(&mut observer, "the successor").await;
    assert_eq!(seen.candidate, "successor");
    assert!(seen.token > crashed.token());
    successor.resign().await.unwrap();
}

/// An announced grant wakes subscribers of the key, here another client's
/// (as another process's would be), when the store says it can announce.
pub async fn announce_wakes_subscribers(store: &TestStore) {
    let k = key(format!("{}k", prefix()));
    let lease = grant(store, &k, LONG).await;
    let mut subscription = store.backend.subscribe(&k).await.unwrap();
    let announcer = store.second_client();
    let announced = announcer.announce(&k).await.expect("store answers");
    if store.caps.notifies && announced {
        timeout(NOTICE, subscription.notified())
            .await
            .expect("an announcement wakes subscribers");
    }
    assert_eq!(
        store.backend.inspect(&k).await.unwrap().map(|i| i.token),
        Some(lease.token()),
        "announcing leaves the lease as it was"
    );
    store.backend.release(&lease).await.unwrap();
}
