//! The lease protocol: the properties every store passes, whatever it
//! offers beyond it.

use std::time::Duration;

use tokio::time::{sleep, timeout, Instant};

use super::{grant, handed_off, held, is_busy, key, prefix, request, TestStore, LONG, SHORT};
use crate::backend::{Acquire, Backend, Lease};
use crate::error::Error;
use crate::key::Key;
use crate::lock::AcquireOptions;

/// Of many simultaneous contenders for one free key, exactly one wins.
pub async fn exclusion_under_race(store: &TestStore) {
    for round in 0..5 {
        let k = key(format!("{}race{round}", prefix()));
        let attempts = (0..24).map(|_| {
            let backend = store.backend.clone();
            let req = request(&k, LONG);
            tokio::spawn(async move { backend.try_acquire(&req).await })
        });
        let mut winners = 0;
        for attempt in attempts.collect::<Vec<_>>() {
            if let Acquire::Granted(_) = attempt.await.unwrap().expect("store answers") {
                winners += 1;
            }
        }
        assert_eq!(winners, 1, "round {round}: exactly one contender must win");
    }
}

/// After a release the key can be taken again, with a larger token.
pub async fn release_then_reacquire(store: &TestStore) {
    let k = key(format!("{}k", prefix()));
    let first = grant(store, &k, LONG).await;
    assert!(is_busy(store, &k).await, "held key is busy");
    store.backend.release(&first).await.unwrap();
    let second = grant(store, &k, LONG).await;
    assert!(second.token() > first.token());
}

/// Renewal pushes the expiry forward, by the store's clock.
pub async fn renew_extends(store: &TestStore) {
    let k = key(format!("{}k", prefix()));
    let lease = grant(store, &k, Duration::from_millis(800)).await;
    sleep(Duration::from_millis(400)).await;
    assert!(store
        .backend
        .renew(&lease, Duration::from_secs(5))
        .await
        .unwrap());
    sleep(Duration::from_millis(800)).await;
    let info = held(store, &k, "the renewal did not extend the lease").await;
    assert_eq!(info.token, lease.token());
    assert!(info.remaining > Duration::from_secs(2), "{info:?}");
    assert!(is_busy(store, &k).await);
}

/// An expired lease cannot be renewed, even if nobody took the key since.
pub async fn renew_after_expiry_fails(store: &TestStore) {
    let k = key(format!("{}k", prefix()));
    let lease = grant(store, &k, SHORT).await;
    sleep(store.past_expiry(SHORT * 2)).await;
    assert!(
        !store.backend.renew(&lease, LONG).await.unwrap(),
        "expired lease renewed"
    );
    assert!(
        store.backend.inspect(&k).await.unwrap().is_none(),
        "expired lease resurrected"
    );
}

/// Renew and release must present the right owner and token.
pub async fn non_owner_cannot_renew_or_release(store: &TestStore) {
    let k = key(format!("{}k", prefix()));
    let lease = grant(store, &k, LONG).await;
    let other_owner = request(&k, LONG).granted(lease.token());
    let same_owner_old_token = request(&k, LONG)
        .with_owner(lease.owner())
        .granted(lease.token().wrapping_sub(1));
    for forged in [&other_owner, &same_owner_old_token] {
        assert!(
            !store.backend.renew(forged, LONG).await.unwrap(),
            "forged renew accepted"
        );
        store.backend.release(forged).await.unwrap();
        let info = held(store, &k, "a forged release freed it").await;
        assert_eq!(info.token, lease.token());
    }
}

/// Tokens strictly increase across release, expiry and force-release.
pub async fn tokens_strictly_increase(store: &TestStore) {
    let k = key(format!("{}k", prefix()));
    let mut tokens = Vec::new();
    let a = grant(store, &k, LONG).await;
    tokens.push(a.token());
    store.backend.release(&a).await.unwrap();
    let b = grant(store, &k, SHORT).await;
    tokens.push(b.token());
    sleep(store.past_expiry(SHORT * 2)).await;
    let c = grant(store, &k, LONG).await;
    tokens.push(c.token());
    assert!(store.backend.force_release(&k).await.unwrap());
    let d = grant(store, &k, LONG).await;
    tokens.push(d.token());
    store.backend.release(&d).await.unwrap();
    // Force-releasing a free key still moves the fence.
    store.backend.force_release(&k).await.unwrap();
    let e = grant(store, &k, LONG).await;
    tokens.push(e.token());
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens must strictly increase: {tokens:?}"
    );
    assert!(
        e.token() >= d.token() + 2,
        "force-release bumps the fence: {tokens:?}"
    );
}

/// A lease that is not renewed frees the key after its ttl.
pub async fn expiry_frees(store: &TestStore) {
    let k = key(format!("{}k", prefix()));
    let first = grant(store, &k, SHORT).await;
    assert!(is_busy(store, &k).await);
    sleep(store.past_expiry(SHORT * 2)).await;
    let second = grant(store, &k, LONG).await;
    assert!(second.token() > first.token());
}

/// A busy answer names the holder and how long its lease can still last.
pub async fn busy_reports_holder_and_remaining_ttl(store: &TestStore) {
    let k = key(format!("{}k", prefix()));
    let ttl = Duration::from_secs(20);
    grant(store, &k, ttl).await;
    match store.backend.try_acquire(&request(&k, LONG)).await.unwrap() {
        Acquire::Busy(busy) => {
            assert_eq!(busy.holder, "conformance");
            assert!(busy.remaining <= ttl, "{busy:?}");
            assert!(busy.remaining > ttl - Duration::from_secs(5), "{busy:?}");
        }
        other => panic!("second acquisition of a held key: {other:?}"),
    }
    match store.locks().try_acquire(k.as_str()).await {
        Err(Error::Busy {
            holder, remaining, ..
        }) => {
            assert_eq!(holder, "conformance");
            assert!(remaining > Duration::ZERO);
        }
        other => panic!("expected Error::Busy, got {other:?}"),
    }
}

/// Inspect and list report live holders only, filtered by prefix, in key order.
pub async fn inspect_and_list(store: &TestStore) {
    let p = prefix();
    let b = grant(store, &key(format!("{p}b")), LONG).await;
    let a = grant(store, &key(format!("{p}a")), LONG).await;
    grant(store, &key(format!("{p}expired")), SHORT).await;
    let outside = grant(store, &key(format!("other{p}")), LONG).await;
    sleep(store.past_expiry(SHORT * 2)).await;

    let listed = store.backend.list(&p).await.unwrap();
    let keys: Vec<_> = listed.iter().map(|i| i.key.as_str().to_owned()).collect();
    assert_eq!(keys, [format!("{p}a"), format!("{p}b")]);
    assert_eq!(listed[0].token, a.token());
    assert_eq!(listed[1].token, b.token());
    assert!(listed
        .iter()
        .all(|i| i.holder == "conformance" && i.remaining > Duration::ZERO));

    let info = store.backend.inspect(b.key()).await.unwrap().unwrap();
    assert_eq!((info.token, info.key.clone()), (b.token(), b.key().clone()));
    for gone in ["expired", "never"] {
        let info = store.backend.inspect(&key(format!("{p}{gone}"))).await;
        assert!(info.unwrap().is_none(), "{gone}");
    }
    let all = store.backend.list("").await.unwrap();
    assert!(all.iter().any(|i| &i.key == outside.key()));
}

/// Force-release frees a live lease, bumps the fence, and the evicted holder
/// can no longer renew.
pub async fn force_release_frees_and_bumps_fence(store: &TestStore) {
    let k = key(format!("{}k", prefix()));
    assert!(
        !store.backend.force_release(&k).await.unwrap(),
        "unknown key: nothing broken"
    );
    let evicted = grant(store, &k, LONG).await;
    assert!(store.backend.force_release(&k).await.unwrap());
    assert!(store.backend.inspect(&k).await.unwrap().is_none());
    assert!(!store.backend.renew(&evicted, LONG).await.unwrap());
    let next = grant(store, &k, LONG).await;
    assert!(next.token() > evicted.token() + 1);
}

/// Releasing twice, or after another took the key, changes nothing.
pub async fn release_is_idempotent(store: &TestStore) {
    let k = key(format!("{}k", prefix()));
    let old = grant(store, &k, SHORT).await;
    store.backend.release(&old).await.unwrap();
    store.backend.release(&old).await.unwrap();
    let current = grant(store, &k, LONG).await;
    store.backend.release(&old).await.unwrap();
    let info = held(store, &k, "an old lease's release freed the new owner's").await;
    assert_eq!(info.token, current.token());
}

/// Bad input fails with `InvalidInput` before reaching the store, which keeps
/// working and holds no stray record.
pub async fn invalid_input_rejected_before_io(store: &TestStore) {
    let locks = store.locks();
    let p = prefix();
    let long = "k".repeat(300);
    // One byte over the limit, in multi-byte characters: the limit is bytes.
    let long_utf8 = format!("{}é", "k".repeat(255));
    for bad in [
        "",
        long.as_str(),
        long_utf8.as_str(),
        "a\0b",
        "line\nbreak",
        "\r",
        "\u{1b}[31m",
        "del\u{7f}",
        "c1\u{85}",
    ] {
        match locks.try_acquire(bad).await {
            Err(Error::InvalidInput { what: "key", .. }) => {}
            other => panic!("key {bad:?}: expected InvalidInput, got {other:?}"),
        }
        assert!(matches!(
            locks.inspect(bad).await,
            Err(Error::InvalidInput { .. })
        ));
        assert!(matches!(
            locks.force_release(bad).await,
            Err(Error::InvalidInput { .. })
        ));
    }
    // Zero stands in for "negative" (a Duration cannot be); MAX must not
    // overflow a deadline anywhere.
    for ttl in [
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::from_millis(99),
        Duration::from_secs(86_401),
        Duration::MAX,
    ] {
        let opts = AcquireOptions::new().with_ttl(ttl);
        match locks.acquire_with(&format!("{p}ttl"), &opts).await {
            Err(Error::InvalidInput { what: "ttl", .. }) => {}
            other => panic!("ttl {ttl:?}: expected InvalidInput, got {other:?}"),
        }
    }
    for prefix in ["x\u{7}", long.as_str()] {
        assert!(matches!(
            locks.list(prefix).await,
            Err(Error::InvalidInput { what: "prefix", .. })
        ));
    }
    assert!(locks.list(&p).await.unwrap().is_empty(), "no stray records");
    // An unbounded wait is a valid request, not an overflow.
    let opts = AcquireOptions::new()
        .with_ttl(Duration::from_secs(5))
        .with_wait(Duration::MAX);
    let guard = locks
        .acquire_with(&format!("{p}ok"), &opts)
        .await
        .expect("store still works");
    guard.release().await.unwrap();
    assert!(locks.list(&p).await.unwrap().is_empty(), "released");
}

/// Keys shaped like SQL, operators or patterns are stored and locked verbatim.
pub async fn hostile_keys_are_plain_strings(store: &TestStore) {
    let p = prefix();
    // Held across the hostile keys: an injection that dropped or rewrote
    // records would take it with it.
    let sentinel = grant(store, &key(format!("{p}sentinel")), LONG).await;
    let hostile = [
        "'; DROP TABLE leasehold_locks; --",
        "'; DROP TABLE x; --",
        "\" OR 1=1 --",
        "$ne",
        "$where",
        "{\"$ne\":1}",
        "{\"$gt\":\"\"}",
        "a.b",
        "..",
        "*",
        "?",
        "[a-z]",
        "{x}",
        "}{",
        "%",
        "_",
        "\\",
        "ü€𝄞",
    ];
    for h in hostile {
        let k = key(format!("{p}{h}"));
        let lease = grant(store, &k, LONG).await;
        let info = held(store, &k, "the hostile key was not stored as given").await;
        assert_eq!(info.key, k);
        assert!(is_busy(store, &k).await);
        store.backend.release(&lease).await.unwrap();
        // Unprefixed too: a key that is only the pattern must not match others.
        let bare = key(h.to_owned());
        if let Some(info) = store.backend.inspect(&bare).await.unwrap() {
            assert_eq!(info.key, bare, "inspect of {h:?} returned another key");
        }
    }
    let listed = store.backend.list(&p).await.unwrap();
    assert_eq!(listed.len(), 1, "only the sentinel is held: {listed:?}");
    assert_eq!(listed[0].token, sentinel.token());
    store.backend.release(&sentinel).await.unwrap();
    // Pattern characters must not widen a prefix listing.
    let star = grant(store, &key(format!("{p}*")), LONG).await;
    grant(store, &key(format!("{p}a")), LONG).await;
    let listed = store.backend.list(&format!("{p}*")).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(&listed[0].key, star.key());
    let listed = store.backend.list(&format!("{p}%")).await.unwrap();
    assert!(listed.is_empty(), "{listed:?}");
}

/// A release wakes a waiting acquirer long before the holder's ttl ends.
pub async fn release_wakes_waiter_quickly(store: &TestStore) {
    let k = key(format!("{}k", prefix()));
    let mut holder = grant(store, &k, LONG).await;
    if store.caps.notifies {
        let mut sub = store.backend.subscribe(&k).await.unwrap();
        assert!(
            sub.is_live(),
            "store claims notifications but gave a dead subscription"
        );
        store.backend.release(&holder).await.unwrap();
        timeout(Duration::from_secs(5), sub.notified())
            .await
            .expect("release notification must arrive");
        holder = grant(store, &k, LONG).await;
    }
    waiter_takes_over_after_release(store, store.backend.as_ref(), &k, holder).await;
}

/// A waiter through the core takes `k` soon after `releaser` lets
/// `holder` go, long before the holder's ttl would have ended.
pub(super) async fn waiter_takes_over_after_release(
    store: &TestStore,
    releaser: &dyn Backend,
    k: &Key,
    holder: Lease,
) {
    let locks = store.locks();
    let key_name = k.as_str().to_owned();
    let waiter = async move { locks.acquire(&key_name, Duration::from_secs(20)).await };
    let guard = handed_off(
        waiter,
        releaser,
        &holder,
        "waiter acquires after the release",
    )
    .await;
    assert!(guard.token() > holder.token());
    guard.release().await.unwrap();
}

/// A waiter gives up at its bound, not later, with `Timeout`, which names
/// the holder it waited behind and what remains of that lease.
pub async fn waiter_never_exceeds_its_bound(store: &TestStore) {
    let k = key(format!("{}k", prefix()));
    grant(store, &k, LONG).await;
    let bound = Duration::from_millis(300);
    let started = Instant::now();
    match store.locks().acquire(k.as_str(), bound).await {
        Err(Error::Timeout {
            waited,
            holder,
            remaining,
            ..
        }) => {
            assert!(waited >= bound, "gave up early: {waited:?}");
            // `grant` labels its leases "conformance".
            assert_eq!(holder.as_deref(), Some("conformance"));
            let remaining = remaining.expect("a remaining ttl with the holder");
            // Less than the ttl by at least the wait (minus clock slack), and
            // not run out: the lease has most of its 30 s left.
            assert!(
                remaining <= LONG - bound + Duration::from_millis(50),
                "{remaining:?}"
            );
            assert!(remaining > LONG / 2, "{remaining:?}");
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    // Generous slack for a loaded machine; the bound itself is enforced by
    // the deadline arithmetic, tested on paused time in the core.
    assert!(started.elapsed() < bound + Duration::from_secs(2));
}
