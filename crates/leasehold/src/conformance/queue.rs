//! Group `queue`: a store that keeps a queue of waiters per key
//! ([`Backend::queues`]) grants in the order the waiters came, hands a
//! released key to the head alone, and never lets a dead waiter hold the
//! queue up past its entry's lease or its claim window.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::{sleep, timeout, Instant};

use super::{attempt, grant, key, prefix, request, TestStore, LONG, SHORT};
use crate::backend::{Acquire, AcquireRequest, Lease, QUEUE_ENTRY_TTL};
use crate::guard::LeaseGuard;
use crate::lock::{AcquireOptions, Locks};

/// Long enough for a waiter's first attempt to reach the store, so the
/// next one started after it queues behind it.
const STAGGER: Duration = Duration::from_millis(150);
/// How long a waiter that is not the head is watched for a stray wake-up.
const QUIET_FOR: Duration = Duration::from_millis(300);
/// A hand-off reaches the head within this, on a loaded machine.
const HANDED_WITHIN: Duration = Duration::from_secs(2);

/// A fresh key for one test of the group, on a store that keeps queues.
fn queue_key(store: &TestStore) -> crate::Key {
    assert!(
        store.backend.queues(),
        "group `queue` is for stores whose queues() is true"
    );
    key(format!("{}k", prefix()))
}

/// `waiter`'s first attempt, at a key that is held: busy, and the waiter
/// is in the key's queue from here (its entry's lease counts from here).
async fn enqueue(store: &TestStore, waiter: &AcquireRequest) {
    let answer = attempt(&*store.backend, waiter).await;
    assert!(matches!(answer, Acquire::Busy(_)), "{answer:?}");
}

/// A waiter's attempt with its queue entry (lease `entry_ttl`).
fn queued(k: &crate::Key, ttl: Duration, entry_ttl: Duration) -> AcquireRequest {
    request(k, ttl).with_queue_entry(entry_ttl, 0)
}

/// Waiters that came one by one, from two clients (two processes), get the
/// key in the order they came, each handed it by its predecessor's release.
pub async fn queue_waiters_get_the_key_in_the_order_they_came(store: &TestStore) {
    let k = queue_key(store);
    let clients = [
        Locks::from_arc(store.backend.clone()),
        Locks::from_arc(store.second_arc()),
    ];
    let holder = grant(store, &k, LONG).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..6 {
        let locks = clients[i % 2].clone();
        let (k, order) = (k.as_str().to_owned(), order.clone());
        waiters.push(tokio::spawn(async move {
            let guard = locks
                .acquire_with(
                    &k,
                    &AcquireOptions::new()
                        .with_wait(Duration::from_secs(30))
                        .with_fair(true),
                )
                .await
                .expect("each waiter gets the key");
            order.lock().unwrap().push((i, guard.token()));
            sleep(Duration::from_millis(20)).await;
            guard.release().await.unwrap();
        }));
        sleep(STAGGER).await;
    }
    store.backend.release(&holder).await.unwrap();
    for w in waiters {
        timeout(Duration::from_secs(30), w)
            .await
            .expect("the queue drains")
            .unwrap();
    }
    let order = order.lock().unwrap().clone();
    let came: Vec<usize> = order.iter().map(|(i, _)| *i).collect();
    assert_eq!(
        came,
        [0, 1, 2, 3, 4, 5],
        "grants out of the order the waiters came"
    );
    assert!(
        order.windows(2).all(|w| w[0].1 < w[1].1) && order[0].1 > holder.token(),
        "handed-over grants take increasing tokens: {order:?}"
    );
}

/// A release grants the head of the queue (a new token, the head's label)
/// and tells the head alone; the head's repeat is the same grant; anybody
/// else, queued or not, finds the key busy.
pub async fn queue_release_hands_the_key_to_the_head_alone(store: &TestStore) {
    let k = queue_key(store);
    let holder = grant(store, &k, LONG).await;
    let head = AcquireRequest::new(k.clone(), LONG, "head")
        .unwrap()
        .with_queue_entry(QUEUE_ENTRY_TTL, 7);
    let next = queued(&k, LONG, QUEUE_ENTRY_TTL);
    for waiter in [&head, &next] {
        enqueue(store, waiter).await;
    }
    let mut told = store.backend.subscribe(&k).await.unwrap();
    assert!(told.expect_hand_off(head.owner()), "the store notifies");
    let mut untold = store.backend.subscribe(&k).await.unwrap();
    untold.expect_hand_off(next.owner());

    store.backend.release(&holder).await.unwrap();
    timeout(HANDED_WITHIN, told.notified())
        .await
        .expect("the head is told of its grant");
    let grant = told.hand_off().expect("a hand-off, not a plain wake-up");
    assert!(
        grant.token > holder.token(),
        "a handed-over grant takes the next token"
    );
    assert_eq!(grant.ticket, 7, "the ticket its entry carried");
    assert!(
        timeout(QUIET_FOR, untold.notified()).await.is_err(),
        "a waiter behind the head is not woken by a release"
    );
    let info = store
        .backend
        .inspect(&k)
        .await
        .unwrap()
        .expect("held by the head");
    assert_eq!((info.holder.as_str(), info.token), ("head", grant.token));
    let stranger = request(&k, LONG);
    for other in [&next, &stranger] {
        assert!(
            matches!(attempt(&*store.backend, other).await, Acquire::Busy(_)),
            "the head's grant is not anybody else's"
        );
    }
    match attempt(&*store.backend, &head).await {
        Acquire::Granted(lease) => {
            assert_eq!(lease.token(), grant.token, "the head's repeat is its grant");
            assert!(store.backend.renew(&lease, LONG).await.unwrap());
            store.backend.release(&lease).await.unwrap();
        }
        other => panic!("the head's repeat must be granted: {other:?}"),
    }
    timeout(HANDED_WITHIN, untold.notified())
        .await
        .expect("then the next waiter is the head");
    assert!(untold.hand_off().is_some());
}

/// A key freed without a release (its holder's lease ran out) goes to the
/// head of its queue first: an attempt of anybody else, even one that does
/// not queue (`try_acquire`), hands it over and answers busy, naming the
/// head; the head is told and its repeat is the grant.
pub async fn queue_a_free_key_goes_to_the_head_first(store: &TestStore) {
    let k = queue_key(store);
    let holder = grant(store, &k, SHORT).await;
    // An entry that outlives the test: it needs no renewal.
    let head = AcquireRequest::new(k.clone(), LONG, "head")
        .unwrap()
        .with_queue_entry(LONG, 3);
    enqueue(store, &head).await;
    let mut told = store.backend.subscribe(&k).await.unwrap();
    assert!(told.expect_hand_off(head.owner()), "the store notifies");
    sleep(store.past_expiry(SHORT)).await;

    let stranger = request(&k, LONG);
    match attempt(&*store.backend, &stranger).await {
        Acquire::Busy(busy) => assert_eq!(busy.holder, "head", "busy, naming the head"),
        other => panic!("a free key behind a queue is the head's: {other:?}"),
    }
    timeout(HANDED_WITHIN, told.notified())
        .await
        .expect("the head is told of its grant");
    let grant = told.hand_off().expect("a hand-off, not a plain wake-up");
    assert!(grant.token > holder.token(), "the next token");
    assert_eq!(grant.ticket, 3, "the ticket its entry carried");
    match attempt(&*store.backend, &head).await {
        Acquire::Granted(lease) => {
            assert_eq!(lease.token(), grant.token, "the head's repeat is its grant");
            store.backend.release(&lease).await.unwrap();
        }
        other => panic!("the head's repeat must be granted: {other:?}"),
    }
}

/// A guard built from a hand-off is claimed: it outlives its claim window,
/// renewing like any guard, and with renewal off it still lasts its ttl.
pub async fn queue_a_handed_over_guard_lasts_its_ttl(store: &TestStore) {
    let k = queue_key(store);
    // A ttl above the entry's lease, so the claim window (the entry's
    // lease) is shorter than the lease asked for.
    let ttl = QUEUE_ENTRY_TTL + Duration::from_secs(2);
    for auto_renew in [true, false] {
        let holder = grant(store, &k, LONG).await;
        let locks = Locks::from_arc(store.backend.clone());
        let (k2, wait) = (
            k.as_str().to_owned(),
            AcquireOptions::new()
                .with_wait(LONG)
                .with_ttl(ttl)
                .with_auto_renew(auto_renew)
                .with_fair(true),
        );
        let waiting = locks.clone();
        let waiter = tokio::spawn(async move { waiting.acquire_with(&k2, &wait).await });
        sleep(STAGGER).await;
        store.backend.release(&holder).await.unwrap();
        let guard = timeout(HANDED_WITHIN, waiter)
            .await
            .expect("handed over")
            .unwrap()
            .unwrap();
        assert_eq!(locks.stats().handed_over, 1, "built from the hand-off");
        sleep(QUEUE_ENTRY_TTL + Duration::from_millis(500)).await;
        assert!(
            !guard.is_lost(),
            "past the claim window (auto_renew {auto_renew})"
        );
        let info = store.backend.inspect(&k).await.unwrap();
        assert_eq!(
            info.map(|i| i.token),
            Some(guard.token()),
            "the store still grants it past the claim window (auto_renew {auto_renew})"
        );
        guard.release().await.unwrap();
    }
}

/// A waiter that died (its entry never renewed) is skipped once its entry's
/// lease ends: the next waiter gets the key at the release.
pub async fn queue_dead_waiter_leaves_within_its_entry_lease(store: &TestStore) {
    let k = queue_key(store);
    let holder = grant(store, &k, LONG).await;
    let entry_ttl = Duration::from_millis(300);
    let dead = queued(&k, LONG, entry_ttl);
    let (guard, waited) = next_after_a_dead_waiter(
        store,
        &holder,
        &dead,
        entry_ttl + Duration::from_millis(200),
        HANDED_WITHIN,
        "the dead waiter's entry has ended: the live one is next",
    )
    .await;
    assert!(waited < HANDED_WITHIN);
    guard.release().await.unwrap();
}

/// A grant handed over to a waiter that never claims it lapses after the
/// claim window, and the key goes on to the next waiter.
pub async fn queue_unclaimed_hand_off_lapses_to_the_next(store: &TestStore) {
    let k = queue_key(store);
    let holder = grant(store, &k, LONG).await;
    // Its claim window is its ttl, the shorter of the two.
    let claim = Duration::from_millis(500);
    let dead = queued(&k, claim, QUEUE_ENTRY_TTL);
    assert_eq!(dead.claim_window(), claim);
    let (guard, waited) = next_after_a_dead_waiter(
        store,
        &holder,
        &dead,
        STAGGER,
        claim + QUEUE_ENTRY_TTL + HANDED_WITHIN,
        "an unclaimed grant lapses and the key goes on",
    )
    .await;
    // At least the claim window; a
    // coarse store may keep it longer (etcd: the rest of the head's entry
    // lease), which delays the next waiter but is never unsafe.
    assert!(
        waited >= claim.saturating_sub(Duration::from_millis(50)),
        "the dead head's grant held the key for its claim window ({waited:?})"
    );
    guard.release().await.unwrap();
}

/// A waiter whose wait ends without a grant leaves the queue (and gives
/// back a grant handed over to it meanwhile): the key is not held up for
/// the entry's lease or a claim window.
pub async fn queue_a_waiter_that_gives_up_leaves_the_queue(store: &TestStore) {
    let k = queue_key(store);
    let holder = grant(store, &k, LONG).await;
    let locks = Locks::from_arc(store.backend.clone());
    let gave_up = locks
        .acquire_with(
            k.as_str(),
            &AcquireOptions::new()
                .with_wait(Duration::from_millis(300))
                .with_fair(true),
        )
        .await;
    assert!(gave_up.is_err(), "the holder keeps the key past the wait");
    // The leave runs in the background: give it a moment, far below the
    // entry's lease.
    sleep(Duration::from_millis(200)).await;
    store.backend.release(&holder).await.unwrap();
    let free = request(&k, LONG);
    match attempt(&*store.backend, &free).await {
        Acquire::Granted(lease) => store.backend.release(&lease).await.unwrap(),
        other => panic!("a waiter that gave up still held the queue: {other:?}"),
    }

    // Handed over, then left: the grant goes back.
    let holder = grant(store, &k, LONG).await;
    let waiter = queued(&k, LONG, QUEUE_ENTRY_TTL);
    enqueue(store, &waiter).await;
    store.backend.release(&holder).await.unwrap();
    assert!(
        matches!(attempt(&*store.backend, &free).await, Acquire::Busy(_)),
        "handed over to the waiter"
    );
    store.backend.leave_queue(&k, waiter.owner()).await.unwrap();
    match attempt(&*store.backend, &free).await {
        Acquire::Granted(lease) => store.backend.release(&lease).await.unwrap(),
        other => panic!("leaving gives a handed-over grant back: {other:?}"),
    }
}

/// The waiter after a dead one: `dead` (which never comes back) queues for
/// `holder`'s key, then a live waiter through the core behind it; `pause`
/// later `holder` is released. The live waiter's guard (`why`: what getting
/// it shows), which must come within `bound`, and how long after the
/// release it came.
async fn next_after_a_dead_waiter(
    store: &TestStore,
    holder: &Lease,
    dead: &AcquireRequest,
    pause: Duration,
    bound: Duration,
    why: &str,
) -> (LeaseGuard, Duration) {
    enqueue(store, dead).await;
    let live = fair_waiter(store, holder.key());
    sleep(pause).await;
    let released_at = Instant::now();
    store.backend.release(holder).await.unwrap();
    let guard = timeout(bound, live).await.expect(why).unwrap().unwrap();
    (guard, released_at.elapsed())
}

/// An acquisition of `k` through the core, queued at the store, on a task.
fn fair_waiter(
    store: &TestStore,
    k: &crate::Key,
) -> tokio::task::JoinHandle<crate::Result<LeaseGuard>> {
    let locks = Locks::from_arc(store.backend.clone());
    let (k, wait) = (
        k.as_str().to_owned(),
        AcquireOptions::new().with_wait(LONG).with_fair(true),
    );
    tokio::spawn(async move { locks.acquire_with(&k, &wait).await })
}
