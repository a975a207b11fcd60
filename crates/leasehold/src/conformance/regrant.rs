//! A repeated request (the `Backend` contract, docs/architecture.md): the
//! core repeats a request after a grant that came too late, and a client
//! library re-sends a command after a dropped connection. A repeat by the
//! owner that holds a live grant is that grant again (same token, same
//! slot), its store expiry counted from the repeat; it never takes a
//! second slot and is never "busy" to that owner; a repeat after the grant
//! expired and another owner took it is busy. Checked for every kind of
//! request: the mutex (protocol), a semaphore's permit (group `semaphore`)
//! and both sides of a reader-writer lock (group `rwlock`).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{sleep, Instant};

use super::{attempt, key, prefix, slots_of, TestStore, SHORT};
use crate::backend::{Acquire, AcquireRequest, Backend, Lease, RwSide};
use crate::key::Key;
use crate::lock::Locks;
use crate::testing::{Fault, Faulty, Op};

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Mutex,
    /// A permit of a semaphore of this many permits.
    Permit(u32),
    Read,
    Write,
}

impl Kind {
    fn request(self, k: &Key, ttl: Duration) -> AcquireRequest {
        let label = "conformance";
        match self {
            Kind::Mutex => AcquireRequest::new(k.clone(), ttl, label),
            Kind::Permit(n) => AcquireRequest::permit(k.clone(), ttl, label, n),
            Kind::Read => AcquireRequest::rw(k.clone(), ttl, label, RwSide::Read),
            Kind::Write => AcquireRequest::rw(k.clone(), ttl, label, RwSide::Write),
        }
        .expect("valid request")
    }

    /// The same kind of lock, one permit only (so one grant excludes the
    /// next), and the kind that excludes a holder of this one.
    fn exclusive(self) -> (Kind, Kind) {
        match self {
            Kind::Permit(_) => (Kind::Permit(1), Kind::Permit(1)),
            Kind::Read => (Kind::Read, Kind::Write),
            other => (other, other),
        }
    }
}

async fn granted(backend: &dyn Backend, req: &AcquireRequest, what: &str) -> Lease {
    match attempt(backend, req).await {
        Acquire::Granted(lease) => lease,
        b => panic!(
            "{what}: {:?} of {:?} not granted: {b:?}",
            req.permit_kind(),
            req.key()
        ),
    }
}

/// Asserts that the live grants of `held`'s key of this kind are `held`
/// (its token and slot) alone; `why` says what that shows.
async fn holds_only(store: &TestStore, kind: Kind, held: &Lease, why: &str) {
    let listed = live(store, kind, held.key()).await;
    assert_eq!(
        listed.iter().map(|(t, s, _)| (*t, *s)).collect::<Vec<_>>(),
        [(held.token(), held.slot())],
        "{why}"
    );
}

/// The live grants of `k` of this kind, as (token, slot, time left).
async fn live(store: &TestStore, kind: Kind, k: &Key) -> Vec<(u64, Option<u32>, Duration)> {
    if kind == Kind::Mutex {
        let info = store.backend.inspect(k).await.expect("store answers");
        return info
            .map(|i| (i.token, None, i.remaining))
            .into_iter()
            .collect();
    }
    let rw = matches!(kind, Kind::Read | Kind::Write);
    slots_of(store, k)
        .await
        .into_iter()
        .filter(|p| p.rw.is_some() == rw)
        .map(|p| (p.token, Some(p.slot), p.remaining))
        .collect()
}

/// A repeat while the grant is live: the same grant, and the store's
/// expiry counted from the repeat (more time left than the first
/// attempt's ttl leaves by then).
async fn repeat_is_the_same_grant_extended(store: &TestStore, kind: Kind) {
    let k = key(format!("{}regrant", prefix()));
    let ttl = Duration::from_secs(3);
    let req = kind.request(&k, ttl);
    let first = granted(store.backend.as_ref(), &req, "first attempt").await;
    let pause = Duration::from_secs(1);
    sleep(pause).await;
    let repeat = granted(
        store.backend.as_ref(),
        &req,
        "a repeat by the owner that holds is never busy",
    )
    .await;
    assert_eq!(
        (repeat.token(), repeat.slot()),
        (first.token(), first.slot()),
        "a repeat is the same grant"
    );
    let listed = live(store, kind, &k).await;
    assert_eq!(listed.len(), 1, "one grant: {listed:?}");
    let (token, slot, left) = listed[0];
    assert_eq!((token, slot), (first.token(), first.slot()));
    // The first attempt's expiry leaves at most ttl - pause (2 s) now.
    assert!(
        left > ttl - pause + Duration::from_millis(300),
        "the store's expiry is counted from the repeat: {left:?} left of {ttl:?}"
    );
    // The lease a repeat answers renews and releases as the first one.
    assert!(
        renew(store, &repeat, ttl).await,
        "the repeated grant renews"
    );
}

async fn renew(store: &TestStore, lease: &Lease, ttl: Duration) -> bool {
    store
        .backend
        .renew(lease, ttl)
        .await
        .expect("store answers")
}

/// A repeat never takes a second slot: the key still lists one grant of
/// the owner, and on a semaphore of 2 another owner still gets a permit
/// (then a third is busy).
async fn repeat_takes_no_second_slot(store: &TestStore, kind: Kind) {
    let k = key(format!("{}regrant", prefix()));
    let ttl = Duration::from_secs(30);
    let req = kind.request(&k, ttl);
    let first = granted(store.backend.as_ref(), &req, "first attempt").await;
    for _ in 0..2 {
        granted(store.backend.as_ref(), &req, "a repeat").await;
    }
    holds_only(store, kind, &first, "a repeat took no second grant").await;
    let other = kind.request(&k, ttl);
    match kind {
        Kind::Permit(2) => {
            let second = granted(store.backend.as_ref(), &other, "the other permit").await;
            assert_ne!(second.slot(), first.slot());
            let third = attempt(store.backend.as_ref(), &kind.request(&k, ttl)).await;
            assert!(
                matches!(third, Acquire::Busy(_)),
                "2 permits taken: {third:?}"
            );
        }
        Kind::Read => {
            granted(store.backend.as_ref(), &other, "another reader shares").await;
        }
        _ => {
            let refused = attempt(store.backend.as_ref(), &other).await;
            assert!(matches!(refused, Acquire::Busy(_)), "{refused:?}");
        }
    }
}

/// A repeat after its grant expired and another owner took the lock is
/// busy: an expired grant is never resurrected.
async fn repeat_after_takeover_is_busy(store: &TestStore, kind: Kind) {
    let k = key(format!("{}regrant", prefix()));
    let (kind, rival) = kind.exclusive();
    let req = kind.request(&k, SHORT);
    granted(store.backend.as_ref(), &req, "first attempt").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    // The other owner; as a writer it waits (until `deadline`), so it
    // marks the lock while readers hold.
    let other = rival
        .request(&k, Duration::from_secs(30))
        .with_lock_deadline(deadline);
    if kind == Kind::Read {
        // Once the reader's grant has expired, its repeat meets the mark.
        let marked = attempt(store.backend.as_ref(), &other).await;
        assert!(
            matches!(marked, Acquire::Busy(_)),
            "a reader holds: {marked:?}"
        );
        while !live(store, kind, &k).await.is_empty() {
            assert!(
                Instant::now() < deadline,
                "the reader's {SHORT:?} never ended"
            );
            sleep(SHORT / 2).await;
        }
        let repeat = attempt(store.backend.as_ref(), &req).await;
        assert!(
            matches!(repeat, Acquire::Busy(_)),
            "an expired reader's repeat meets the waiting writer's mark: {repeat:?}"
        );
    }
    // Another owner takes the lock once the store sees the grant expired.
    let taken = loop {
        match attempt(store.backend.as_ref(), &other).await {
            Acquire::Granted(lease) => break lease,
            Acquire::Busy(_) if Instant::now() < deadline => sleep(SHORT / 2).await,
            b => panic!("the grant of {SHORT:?} never expired: {b:?}"),
        }
    };
    let repeat = attempt(store.backend.as_ref(), &req).await;
    assert!(
        matches!(repeat, Acquire::Busy(_)),
        "an expired grant is not resurrected by a repeat: {repeat:?}"
    );
    holds_only(store, rival, &taken, "the new holder alone holds").await;
}

/// Through the core, with every acquisition delivered to the store twice
/// (as a client library re-sends a command after a dropped connection):
/// the caller gets the grant, which the store holds once, and releasing
/// it frees the lock.
async fn delivered_twice(store: &TestStore, kind: Kind) {
    let k = key(format!("{}regrant", prefix()));
    let faulty = Faulty::new(store.backend.clone());
    faulty.set(Op::TryAcquire, Fault::Twice);
    let locks = Locks::from_arc(Arc::new(faulty.clone())).with_holder_label("conformance");
    let name = k.as_str();
    let guard = match kind {
        Kind::Mutex => locks.try_acquire(name).await,
        Kind::Permit(n) => locks.semaphore(name, n).unwrap().try_acquire().await,
        Kind::Read => locks.rw_lock(name).unwrap().try_read().await,
        Kind::Write => locks.rw_lock(name).unwrap().try_write().await,
    }
    .unwrap_or_else(|e| panic!("a request delivered twice is granted, got: {e}"));
    assert_eq!(
        faulty.calls(Op::TryAcquire),
        1,
        "one attempt by the core (the store saw it twice)"
    );
    holds_only(
        store,
        kind,
        guard.lease(),
        "the store holds the caller's grant once",
    )
    .await;
    if let Kind::Permit(2) = kind {
        let other = kind.request(&k, Duration::from_secs(30));
        granted(store.backend.as_ref(), &other, "the second permit").await;
    }
    guard.release().await.expect("released");
    let (exclusive, _) = kind.exclusive();
    if exclusive == kind {
        assert!(
            live(store, kind, &k).await.is_empty(),
            "released: nothing is left held"
        );
    }
}

macro_rules! properties {
    ($kind:expr; $($name:ident => $property:ident),* $(,)?) => {
        $(
            #[doc = concat!("`", stringify!($property), "` for ", stringify!($kind), " (see the module).")]
            pub async fn $name(store: &TestStore) {
                $property(store, $kind).await;
            }
        )*
    };
}

properties!(Kind::Mutex;
    regrant_mutex_repeat_is_the_same_grant_extended => repeat_is_the_same_grant_extended,
    regrant_mutex_repeat_takes_no_second_grant => repeat_takes_no_second_slot,
    regrant_mutex_repeat_after_takeover_is_busy => repeat_after_takeover_is_busy,
    regrant_mutex_delivered_twice => delivered_twice,
);

properties!(Kind::Permit(2);
    regrant_permit_repeat_is_the_same_grant_extended => repeat_is_the_same_grant_extended,
    regrant_permit_repeat_takes_no_second_slot => repeat_takes_no_second_slot,
    regrant_permit_repeat_after_takeover_is_busy => repeat_after_takeover_is_busy,
    regrant_permit_delivered_twice => delivered_twice,
);

properties!(Kind::Read;
    regrant_reader_repeat_is_the_same_grant_extended => repeat_is_the_same_grant_extended,
    regrant_reader_repeat_takes_no_second_slot => repeat_takes_no_second_slot,
    regrant_reader_repeat_after_takeover_is_busy => repeat_after_takeover_is_busy,
    regrant_reader_delivered_twice => delivered_twice,
);

properties!(Kind::Write;
    regrant_writer_repeat_is_the_same_grant_extended => repeat_is_the_same_grant_extended,
    regrant_writer_repeat_takes_no_second_grant => repeat_takes_no_second_slot,
    regrant_writer_repeat_after_takeover_is_busy => repeat_after_takeover_is_busy,
    regrant_writer_delivered_twice => delivered_twice,
);
