//! One key is one lock (the `# Contract` of [`Backend`]): a mutex, a
//! reader-writer lock and a semaphore of one name are the same lock, and
//! the key's anchor record says which kind it is. Part of the protocol
//! that [`conformance_tests!`](crate::conformance_tests) runs on every
//! store.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::{sleep, Instant};

use super::{key, permits_listed, prefix, TestStore, LONG};
use crate::backend::{
    Acquire, AcquireRequest, Backend, KeyKind, Lease, LeaseInfo, RwSide, WRITER_SLOT,
};
use crate::error::Error;
use crate::key::Key;
use crate::lock::Locks;

/// How long a refusal of another kind may take: one round trip, never a
/// wait (the calls below wait up to [`LONG`]).
const AT_ONCE: Duration = Duration::from_secs(3);

fn rw_request(k: &Key, side: RwSide) -> AcquireRequest {
    AcquireRequest::rw(k.clone(), LONG, "conformance", side).expect("valid request")
}

fn sem_request(k: &Key, permits: u32) -> AcquireRequest {
    AcquireRequest::permit(k.clone(), LONG, "conformance", permits).expect("valid request")
}

fn mutex_request(k: &Key) -> AcquireRequest {
    AcquireRequest::new(k.clone(), LONG, "conformance").expect("valid request")
}

async fn granted(backend: &dyn Backend, req: &AcquireRequest) -> Lease {
    match backend.try_acquire(req).await.expect("store answers") {
        Acquire::Granted(lease) => lease,
        other => panic!("expected a grant of {req:?}, got {other:?}"),
    }
}

/// A held mutex makes a reader (or a semaphore permit) of the same key
/// busy, naming the mutex's holder; once it is released, the key becomes a
/// reader-writer lock with a token above the mutex's, a reader that waited
/// is woken, and a plain mutex request is answered `OtherKind`.
pub async fn kind_mutex_held_excludes_readers_then_converts(store: &TestStore) {
    let k = key(format!("{}kind", prefix()));
    let backend = store.backend.as_ref();
    let mutex = granted(backend, &mutex_request(&k)).await;
    for req in [
        rw_request(&k, RwSide::Read),
        rw_request(&k, RwSide::Write),
        sem_request(&k, 3),
    ] {
        match backend.try_acquire(&req).await.unwrap() {
            Acquire::Busy(busy) => {
                assert_eq!(busy.holder, "conformance");
                assert!(busy.remaining > Duration::ZERO && busy.remaining <= LONG);
            }
            other => panic!("{req:?} beside a held mutex: {other:?}"),
        }
    }
    // A reader waiting (through the core) for the mutex is let in by its
    // release, and the key's tokens go on from the mutex's.
    let locks = store.locks();
    let reader = {
        let locks = locks.clone();
        let k = k.clone();
        tokio::spawn(async move { locks.rw_lock(k.as_str()).unwrap().read(LONG).await })
    };
    sleep(Duration::from_millis(200)).await;
    assert!(!reader.is_finished(), "a reader went in beside the mutex");
    let released_at = Instant::now();
    backend.release(&mutex).await.unwrap();
    let reader = reader.await.unwrap().expect("the reader gets the lock");
    assert!(
        released_at.elapsed() < Duration::from_secs(5),
        "the mutex's release did not let the reader in"
    );
    assert_eq!(reader.rw_side(), Some(RwSide::Read));
    assert!(
        reader.token() > mutex.token(),
        "reader token {} after mutex token {}",
        reader.token(),
        mutex.token()
    );
    match backend.try_acquire(&mutex_request(&k)).await.unwrap() {
        Acquire::OtherKind(KeyKind::ReaderWriter) => {}
        other => panic!("a mutex request of a reader-writer lock's key: {other:?}"),
    }
    // A semaphore of the name is refused now, as a store answer too.
    match backend.try_acquire(&sem_request(&k, 2)).await.unwrap() {
        Acquire::OtherKind(KeyKind::ReaderWriter) => {}
        other => panic!("a semaphore request of a reader-writer lock's key: {other:?}"),
    }
    reader.release().await.unwrap();
}

/// The exclusive acquire of a reader-writer lock's key is its writer: busy
/// (trying once) while a reader holds, granted as the writer (token above
/// the readers') once the readers are gone, and it excludes readers.
pub async fn kind_mutex_acquire_of_an_rw_key_is_its_writer(store: &TestStore) {
    let k = key(format!("{}kind", prefix()));
    let locks = store.locks();
    let rw = locks.rw_lock(k.as_str()).unwrap();
    let first = rw.try_read().await.unwrap();
    let second = rw.try_read().await.unwrap();
    match locks.try_acquire(k.as_str()).await {
        Err(Error::Busy { .. }) => {}
        other => panic!("a mutex acquire beside readers: {other:?}"),
    }
    // One that waits is let in when the readers are gone.
    let exclusive = {
        let locks = locks.clone();
        let k = k.clone();
        tokio::spawn(async move { locks.acquire(k.as_str(), LONG).await })
    };
    sleep(Duration::from_millis(200)).await;
    assert!(
        !exclusive.is_finished(),
        "the exclusive acquire went in beside readers"
    );
    let top = first.token().max(second.token());
    first.release().await.unwrap();
    second.release().await.unwrap();
    let exclusive = exclusive
        .await
        .unwrap()
        .expect("granted once the readers left");
    assert_eq!(exclusive.rw_side(), Some(RwSide::Write));
    assert_eq!(exclusive.slot(), Some(WRITER_SLOT));
    assert!(exclusive.token() > top);
    match rw.try_read().await {
        Err(Error::Busy { .. }) => {}
        other => panic!("a reader beside the exclusive holder: {other:?}"),
    }
    match locks.try_acquire(k.as_str()).await {
        Err(Error::Busy { .. }) => {}
        other => panic!("a second exclusive acquire: {other:?}"),
    }
    // Its guard renews and releases as the writer.
    assert!(exclusive.check().is_ok());
    let token = exclusive.token();
    exclusive.release().await.unwrap();
    let again = locks.try_acquire(k.as_str()).await.unwrap();
    assert!(again.token() > token);
    again.release().await.unwrap();
    let reader = rw.try_read().await.unwrap();
    assert!(reader.token() > token);
    reader.release().await.unwrap();
}

async fn refused_at_once(
    what: &str,
    call: impl std::future::Future<Output = crate::Result<crate::LeaseGuard>>,
    held: KeyKind,
    requested: KeyKind,
) {
    let started = Instant::now();
    match call.await {
        Err(Error::KindMismatch {
            held: h,
            requested: r,
            ..
        }) => {
            assert_eq!((h, r), (held, requested), "{what}");
            assert!(!Error::KindMismatch {
                key: String::new(),
                held,
                requested
            }
            .is_retryable());
        }
        other => panic!("{what}: expected KindMismatch, got {other:?}"),
    }
    assert!(
        started.elapsed() < AT_ONCE,
        "{what}: refused after {:?}, not at once",
        started.elapsed()
    );
}

/// A semaphore's key refuses a mutex and a reader-writer lock of the same
/// name at once, even when they would wait, whether or not a permit is
/// live; the store answers `OtherKind` and keeps the semaphore as it was.
pub async fn kind_semaphore_key_refuses_mutex_and_rw(store: &TestStore) {
    let k = key(format!("{}kind", prefix()));
    let locks = store.locks();
    let sem = locks.semaphore(k.as_str(), 2).unwrap();
    let rw = locks.rw_lock(k.as_str()).unwrap();
    let (held, mutex, rw_kind) = (KeyKind::Semaphore, KeyKind::Mutex, KeyKind::ReaderWriter);
    let permit = sem.try_acquire().await.unwrap();
    let token = permit.token();
    for live in [true, false] {
        if !live {
            permit_release(&sem, &locks).await;
        }
        refused_at_once("mutex", locks.acquire(k.as_str(), LONG), held, mutex).await;
        refused_at_once("try mutex", locks.try_acquire(k.as_str()), held, mutex).await;
        refused_at_once("reader", rw.read(LONG), held, rw_kind).await;
        refused_at_once("writer", rw.write(LONG), held, rw_kind).await;
        match store.backend.try_acquire(&mutex_request(&k)).await.unwrap() {
            Acquire::OtherKind(KeyKind::Semaphore) => {}
            other => panic!("a mutex request of a semaphore's key (live {live}): {other:?}"),
        }
        assert_eq!(sem.holders().await.unwrap().len(), usize::from(live));
    }
    drop(permit);
    let next = sem.try_acquire().await.unwrap();
    assert!(next.token() > token, "the semaphore goes on as it was");
    next.release().await.unwrap();
}

/// Frees every permit of `sem` (the admin break; the guard of the permit
/// taken above then simply finds its lease gone).
async fn permit_release(sem: &crate::Semaphore, locks: &Locks) {
    locks.force_release(sem.key().as_str()).await.unwrap();
    assert!(sem.holders().await.unwrap().is_empty());
}

/// A reader-writer lock's key refuses a semaphore of the same name at
/// once, with or without live holders.
pub async fn kind_rw_key_refuses_semaphore(store: &TestStore) {
    let k = key(format!("{}kind", prefix()));
    let locks = store.locks();
    let rw = locks.rw_lock(k.as_str()).unwrap();
    let reader = rw.try_read().await.unwrap();
    let sem = locks.semaphore(k.as_str(), 3).unwrap();
    let (held, requested) = (KeyKind::ReaderWriter, KeyKind::Semaphore);
    refused_at_once("semaphore, reader live", sem.acquire(LONG), held, requested).await;
    reader.release().await.unwrap();
    refused_at_once("semaphore, none live", sem.acquire(LONG), held, requested).await;
    refused_at_once("try semaphore", sem.try_acquire(), held, requested).await;
    assert!(sem.holders().await.unwrap().is_empty());
    rw.try_write().await.unwrap().release().await.unwrap();
}

/// `force_release` of a key frees whatever holds it: every reader (and
/// the writer's marker) of a reader-writer lock, every permit of a
/// semaphore; the evicted grants cannot renew, and the next grant's token
/// is above theirs.
pub async fn kind_force_release_frees_every_holder(store: &TestStore) {
    let p = prefix();
    let backend = store.backend.as_ref();
    for (name, requests) in [
        (
            "rw",
            [
                rw_request(&key(format!("{p}rw")), RwSide::Read),
                rw_request(&key(format!("{p}rw")), RwSide::Read),
            ],
        ),
        (
            "sem",
            [
                sem_request(&key(format!("{p}sem")), 2),
                sem_request(&key(format!("{p}sem")), 2),
            ],
        ),
    ] {
        let mut leases = Vec::new();
        for req in &requests {
            leases.push(granted(backend, req).await);
        }
        let k = requests[0].key();
        assert!(
            backend.force_release(k).await.unwrap(),
            "{name}: live holders were broken"
        );
        for lease in &leases {
            assert!(
                !backend.renew(lease, LONG).await.unwrap(),
                "{name}: {lease:?} survived"
            );
        }
        let listed = permits_listed(backend, k.as_str()).await.unwrap();
        assert!(listed.iter().all(|p| &p.key != k), "{name}: {listed:?}");
        let top = leases.iter().map(Lease::token).max().unwrap();
        let exclusive = match name {
            "rw" => rw_request(k, RwSide::Write),
            _ => sem_request(k, 1),
        };
        let next = granted(backend, &exclusive).await;
        assert!(
            next.token() > top,
            "{name}: token {} after {top}",
            next.token()
        );
        assert!(!backend
            .force_release(&key(format!("{p}none")))
            .await
            .unwrap());
        backend.release(&next).await.unwrap();
        assert!(
            !backend.force_release(k).await.unwrap(),
            "{name}: nothing live"
        );
    }
}

/// Tasks on two clients, half asking for the key as a mutex and half as a
/// reader, all at once on a fresh key (racing the change of kind) and then
/// in turns: a mutex holder never overlaps another holder, readers never
/// overlap a mutex holder, and every token is unique and above every token
/// granted before it under an exclusive hold.
pub async fn kind_mixed_mutex_and_readers_never_overlap(store: &TestStore) {
    let p = prefix();
    let clients: [Arc<dyn Backend>; 2] = [store.backend.clone(), store.second_arc()];
    for round in 0..3 {
        let k = key(format!("{p}race{round}"));
        let exclusive = Arc::new(AtomicUsize::new(0));
        let shared = Arc::new(AtomicUsize::new(0));
        let top = Arc::new(AtomicU64::new(0));
        let tokens = Arc::new(Mutex::new(Vec::new()));
        let start = Arc::new(tokio::sync::Barrier::new(8));
        let mut tasks = Vec::new();
        for i in 0..8 {
            let locks = Locks::from_arc(clients[i % 2].clone()).with_holder_label("conformance");
            let (k, exclusive, shared, top, tokens, start) = (
                k.clone(),
                exclusive.clone(),
                shared.clone(),
                top.clone(),
                tokens.clone(),
                start.clone(),
            );
            tasks.push(tokio::spawn(async move {
                start.wait().await;
                for _ in 0..3 {
                    if i % 2 == 0 {
                        let guard = locks.acquire(k.as_str(), LONG).await.expect("mutex");
                        assert_eq!(
                            exclusive.fetch_add(1, Ordering::SeqCst),
                            0,
                            "two exclusive holders"
                        );
                        assert_eq!(
                            shared.load(Ordering::SeqCst),
                            0,
                            "an exclusive holder beside readers"
                        );
                        let before = top.fetch_max(guard.token(), Ordering::SeqCst);
                        assert!(
                            guard.token() > before,
                            "exclusive token {} after {before}",
                            guard.token()
                        );
                        tokens.lock().unwrap().push(guard.token());
                        sleep(Duration::from_millis(5)).await;
                        assert_eq!(shared.load(Ordering::SeqCst), 0, "a reader came in");
                        exclusive.fetch_sub(1, Ordering::SeqCst);
                        guard.release().await.unwrap();
                    } else {
                        let rw = locks.rw_lock(k.as_str()).unwrap();
                        let guard = rw.read(LONG).await.expect("reader");
                        shared.fetch_add(1, Ordering::SeqCst);
                        assert_eq!(
                            exclusive.load(Ordering::SeqCst),
                            0,
                            "a reader beside an exclusive holder"
                        );
                        top.fetch_max(guard.token(), Ordering::SeqCst);
                        tokens.lock().unwrap().push(guard.token());
                        sleep(Duration::from_millis(5)).await;
                        assert_eq!(
                            exclusive.load(Ordering::SeqCst),
                            0,
                            "an exclusive holder came in"
                        );
                        shared.fetch_sub(1, Ordering::SeqCst);
                        guard.release().await.unwrap();
                    }
                }
            }));
        }
        for task in tasks {
            task.await.expect("no overlap");
        }
        let mut tokens = std::mem::take(&mut *tokens.lock().unwrap());
        let count = tokens.len();
        tokens.sort_unstable();
        tokens.dedup();
        assert_eq!(tokens.len(), count, "round {round}: a token granted twice");
        assert_eq!(count, 24);
    }
}

/// The store's one listing reports every kind of holder, each saying what
/// it holds (a mutex's holder with no slot, a semaphore's permits with
/// their slots, a lock's readers and writer with their side), in one
/// order: by key, then slot; and the core's three listings are its parts.
pub async fn kind_listing_reports_every_kind_in_one_order(store: &TestStore) {
    let p = prefix();
    let backend = store.backend.as_ref();
    let (m, s, r, w) = (
        key(format!("{p}a-mutex")),
        key(format!("{p}b-semaphore")),
        key(format!("{p}c-readers")),
        key(format!("{p}d-writer")),
    );
    let mut leases = vec![granted(backend, &mutex_request(&m)).await];
    for _ in 0..2 {
        leases.push(granted(backend, &sem_request(&s, 3)).await);
    }
    for _ in 0..2 {
        leases.push(granted(backend, &rw_request(&r, RwSide::Read)).await);
    }
    leases.push(granted(backend, &rw_request(&w, RwSide::Write)).await);

    let listed = backend.list(&p).await.expect("store answers");
    // Everything but the time left, which moves between two listings.
    let shape = |infos: &[LeaseInfo]| -> Vec<_> {
        infos
            .iter()
            .map(|i| (i.key.clone(), i.slot, i.rw, i.token))
            .collect()
    };
    let seen = shape(&listed);
    let want: Vec<_> = leases
        .iter()
        .map(|l| (l.key().clone(), l.slot(), l.rw_side(), l.token()))
        .collect();
    assert_eq!(
        seen, want,
        "one listing, every kind, in key then slot order"
    );
    assert_eq!(
        want.iter().map(|(_, slot, _, _)| *slot).collect::<Vec<_>>(),
        [None, Some(0), Some(1), Some(0), Some(1), Some(WRITER_SLOT)]
    );
    assert!(listed
        .iter()
        .all(|i| i.holder == "conformance" && i.remaining > Duration::ZERO));

    let locks = Locks::from_arc(store.backend.clone());
    let mutexes = locks.list(&p).await.expect("store answers");
    assert_eq!(shape(&mutexes), seen[..1], "list: the mutex holders only");
    let permits = locks.list_permits(&p).await.expect("store answers");
    assert_eq!(
        permits.iter().map(|i| (i.slot, i.rw)).collect::<Vec<_>>(),
        [
            (0, None),
            (1, None),
            (0, Some(RwSide::Read)),
            (1, Some(RwSide::Read)),
            (WRITER_SLOT, Some(RwSide::Write))
        ],
        "list_permits: the permits, readers and writer"
    );
    let holders = locks.list_holders(&p).await.expect("store answers");
    assert_eq!(shape(&holders), seen, "list_holders: the store's listing");

    for lease in &leases {
        backend.release(lease).await.expect("store answers");
    }
    assert!(backend.list(&p).await.expect("store answers").is_empty());
}
