//! The reader-writer lock rules of docs/rw-lock.md, part of the protocol
//! that [`conformance_tests!`](crate::conformance_tests) runs on every store.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{sleep, Instant};

use super::{
    answered_busy, attempt, busy_for, handed_off, key, permits_listed, prefix, slots_of, TestStore,
    LONG, ROUND_TRIP_SLACK, SHORT,
};
use crate::backend::{Acquire, AcquireRequest, Backend, Lease, OwnerId, RwSide, WRITER_SLOT};
use crate::error::Error;
use crate::key::Key;
use crate::lock::{AcquireOptions, Locks};

fn rw_request(k: &Key, ttl: Duration, side: RwSide) -> AcquireRequest {
    AcquireRequest::rw(k.clone(), ttl, "conformance", side).expect("valid request")
}

async fn grant(backend: &dyn Backend, k: &Key, ttl: Duration, side: RwSide) -> Lease {
    match attempt(backend, &rw_request(k, ttl, side)).await {
        Acquire::Granted(lease) => {
            assert_eq!(lease.rw_side(), Some(side));
            lease
        }
        b => panic!("expected {side:?} of {k:?} to be free: {b:?}"),
    }
}

async fn busy(backend: &dyn Backend, k: &Key, side: RwSide) -> bool {
    busy_for(backend, &rw_request(k, LONG, side)).await
}

/// Readers from two clients, all at once, share the lock (distinct reader
/// slots, unique tokens); while any is live a writer is refused; the store
/// lists them as readers. (They go through the core, which retries an
/// attempt that lost a race inside the store.)
pub async fn rw_readers_share(store: &TestStore) {
    let k = key(format!("{}rw", prefix()));
    let clients: [Arc<dyn Backend>; 2] = [store.backend.clone(), store.second_arc()];
    let mut tasks = Vec::new();
    for i in 0..12 {
        let locks = Locks::from_arc(clients[i % 2].clone()).with_holder_label("conformance");
        let k = k.clone();
        tasks.push(tokio::spawn(async move {
            let lock = locks.rw_lock(k.as_str()).unwrap();
            lock.read(Duration::from_secs(10)).await
        }));
    }
    let mut readers = Vec::new();
    for task in tasks {
        readers.push(task.await.unwrap().expect("every reader is granted"));
    }
    let mut slots: Vec<u32> = readers.iter().map(|g| g.slot().unwrap()).collect();
    slots.sort_unstable();
    slots.dedup();
    assert_eq!(slots.len(), 12, "distinct reader slots: {slots:?}");
    assert!(slots.iter().all(|s| *s < WRITER_SLOT));
    let mut tokens: Vec<u64> = readers.iter().map(|g| g.token()).collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 12, "unique tokens");
    assert!(busy(store.backend.as_ref(), &k, RwSide::Write).await);
    let listed = slots_of(store, &k).await;
    assert_eq!(listed.len(), 12, "{listed:?}");
    assert!(listed.iter().all(|p| p.rw == Some(RwSide::Read)));
    // The last reader out lets the writer in.
    for r in readers {
        r.release().await.unwrap();
    }
    let w = grant(store.backend.as_ref(), &k, LONG, RwSide::Write).await;
    assert!(tokens.iter().all(|t| w.token() > *t));
}

/// A writer excludes readers and writers, from either client; a busy
/// answer names the writer and its time left; the store lists it in the
/// writer's slot.
pub async fn rw_writer_excludes_readers_and_writers(store: &TestStore) {
    let k = key(format!("{}rw", prefix()));
    let w = grant(store.backend.as_ref(), &k, LONG, RwSide::Write).await;
    assert_eq!(w.slot(), Some(WRITER_SLOT));
    for backend in [store.backend.as_ref(), store.second_client()] {
        for side in [RwSide::Read, RwSide::Write] {
            match attempt(backend, &rw_request(&k, LONG, side)).await {
                Acquire::Busy(b) => {
                    assert_eq!(b.holder, "conformance");
                    assert!(b.remaining > Duration::ZERO && b.remaining <= LONG, "{b:?}");
                }
                l => panic!("{side:?} beside a writer: {l:?}"),
            }
        }
    }
    let listed = slots_of(store, &k).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].rw, Some(RwSide::Write));
    assert_eq!(listed[0].slot, WRITER_SLOT);
    assert_eq!(listed[0].token, w.token());
    store.backend.release(&w).await.unwrap();
    let r = grant(store.backend.as_ref(), &k, LONG, RwSide::Read).await;
    assert!(r.token() > w.token());
}

/// Every grant's token is above every earlier grant of the key, readers
/// and writers alike, across release and expiry.
pub async fn rw_tokens_never_go_backwards(store: &TestStore) {
    let k = key(format!("{}rw", prefix()));
    let backend = store.backend.as_ref();
    let mut last = 0;
    for round in 0..6 {
        let ttl = if round % 3 == 2 { SHORT } else { LONG };
        let side = if round % 2 == 0 {
            RwSide::Read
        } else {
            RwSide::Write
        };
        let lease = grant(backend, &k, ttl, side).await;
        assert!(lease.token() > last, "token {} after {last}", lease.token());
        last = lease.token();
        if side == RwSide::Read {
            // A second reader alongside, so the writer follows two readers.
            let other = grant(backend, &k, LONG, RwSide::Read).await;
            assert!(other.token() > last);
            last = other.token();
            backend.release(&other).await.unwrap();
        }
        if ttl == SHORT {
            sleep(store.past_expiry(SHORT + Duration::from_millis(150))).await;
        } else {
            backend.release(&lease).await.unwrap();
        }
    }
}

/// Renew and release act only for the grant's owner, token and slot;
/// renew never revives an expired grant; release is idempotent.
pub async fn rw_owner_checked_renew_release(store: &TestStore) {
    let k = key(format!("{}rw", prefix()));
    let backend = store.backend.as_ref();
    for side in [RwSide::Read, RwSide::Write] {
        let lease = grant(backend, &k, LONG, side).await;
        let slot = lease.slot().unwrap();
        let stranger = rw_request(&k, LONG, side)
            .with_owner(OwnerId::random())
            .granted_permit(slot, lease.token());
        let old_token = rw_request(&k, LONG, side)
            .with_owner(lease.owner())
            .granted_permit(slot, lease.token() - 1);
        for forged in [&stranger, &old_token] {
            assert!(!backend.renew(forged, LONG).await.unwrap(), "{forged:?}");
            backend.release(forged).await.unwrap();
            assert_eq!(
                slots_of(store, &k).await.len(),
                1,
                "a forged release freed {forged:?}"
            );
        }
        // A semaphore permit of the same key and slot is another record.
        let as_permit = AcquireRequest::permit(k.clone(), LONG, "conformance", 1)
            .unwrap()
            .with_owner(lease.owner())
            .granted_permit(slot, lease.token());
        backend.release(&as_permit).await.unwrap();
        assert_eq!(slots_of(store, &k).await.len(), 1);
        assert!(backend.renew(&lease, LONG).await.unwrap());
        backend.release(&lease).await.unwrap();
        backend.release(&lease).await.unwrap();
        assert!(!backend.renew(&lease, LONG).await.unwrap());
        let short = grant(backend, &k, SHORT, side).await;
        sleep(store.past_expiry(SHORT + Duration::from_millis(150))).await;
        assert!(!backend.renew(&short, LONG).await.unwrap(), "revived");
        assert!(slots_of(store, &k).await.is_empty());
    }
}

/// A reader or writer nobody renews or releases (a crashed holder) lets
/// the other side in after its ttl, by the store's clock.
pub async fn rw_crashed_holder_returns_after_ttl(store: &TestStore) {
    let k = key(format!("{}rw", prefix()));
    let backend = store.backend.as_ref();
    let reader = grant(backend, &k, SHORT, RwSide::Read).await;
    assert!(busy(backend, &k, RwSide::Write).await);
    sleep(store.past_expiry(SHORT + Duration::from_millis(150))).await;
    let writer = grant(backend, &k, SHORT, RwSide::Write).await;
    assert!(writer.token() > reader.token());
    assert!(busy(backend, &k, RwSide::Read).await);
    sleep(store.past_expiry(SHORT + Duration::from_millis(150))).await;
    let back = grant(backend, &k, LONG, RwSide::Read).await;
    assert!(back.token() > writer.token());
    assert!(!backend.renew(&writer, LONG).await.unwrap());
}

/// How long each reader of the stream holds the lock.
const READER_HOLD: Duration = Duration::from_millis(600);

/// A writer that waits behind a continuous stream of overlapping readers
/// (each holds `READER_HOLD`, 600 ms, a new one starts every third of that, from
/// handles of their own on both clients) gets the lock within two reader
/// hold times: its marker turns new readers away, and the readers present
/// when it came finish within one hold time.
pub async fn rw_waiting_writer_is_not_starved(store: &TestStore) {
    let k = key(format!("{}rw", prefix()));
    let clients: [Arc<dyn Backend>; 2] = [store.backend.clone(), store.second_arc()];
    let stop = tokio_util::sync::CancellationToken::new();
    let stream = {
        let (k, stop) = (k.clone(), stop.clone());
        tokio::spawn(async move {
            let mut readers = Vec::new();
            let mut i = 0;
            while !stop.is_cancelled() {
                let locks = Locks::from_arc(clients[i % 2].clone()).with_holder_label("reader");
                let k = k.clone();
                readers.push(tokio::spawn(async move {
                    let lock = locks.rw_lock(k.as_str()).unwrap();
                    // Readers wait: turned away by the writer, they come back after it.
                    let guard = lock.read(Duration::from_secs(30)).await.unwrap();
                    sleep(READER_HOLD).await;
                    guard.release().await.unwrap();
                }));
                i += 1;
                sleep(READER_HOLD / 3).await;
            }
            readers
        })
    };
    // Let the stream run so that readers overlap before the writer comes.
    sleep(READER_HOLD * 2).await;
    assert!(
        !slots_of(store, &k).await.is_empty(),
        "the stream holds the lock"
    );
    let writer = store
        .locks()
        .with_holder_label("writer")
        .rw_lock(k.as_str())
        .unwrap();
    let asked = Instant::now();
    let guard = writer
        .write_with(&AcquireOptions::new().with_wait(Duration::from_secs(10)))
        .await;
    let waited = asked.elapsed();
    let guard = guard.expect("the writer gets the lock within its wait");
    let listed = slots_of(store, &k).await;
    assert!(
        listed.iter().all(|p| p.rw == Some(RwSide::Write)),
        "the writer alone: {listed:?}"
    );
    guard.release().await.unwrap();
    stop.cancel();
    for reader in stream.await.unwrap() {
        reader.await.unwrap();
    }
    assert!(
        waited <= READER_HOLD * 2 + ROUND_TRIP_SLACK,
        "the writer waited {waited:?} behind a stream of {READER_HOLD:?} readers"
    );
}

/// A waiting writer's marker turns away a reader whose client's view of the
/// lock went stale (it saw the lock empty; the other client's readers and
/// waiting writer came since), though reader slot 0 is free; the writer
/// then gets the lock, and readers come back after it with higher tokens.
pub async fn rw_waiting_writer_turns_away_a_stale_reader(store: &TestStore) {
    let k = key(format!("{}rw", prefix()));
    let (a, b) = (store.locks(), store.second_locks());
    // A has seen the lock empty (a read taken and given back).
    let warm = a.rw_lock(k.as_str()).unwrap().try_read().await.unwrap();
    assert_eq!(warm.slot(), Some(0));
    warm.release().await.unwrap();
    let readers = b.rw_lock(k.as_str()).unwrap();
    let r0 = readers.try_read().await.unwrap();
    let r1 = readers.try_read().await.unwrap();
    assert_eq!((r0.slot(), r1.slot()), (Some(0), Some(1)));
    r0.release().await.unwrap();
    // The writer waits behind r1, its marker set.
    let writer = {
        let lock = b.rw_lock(k.as_str()).unwrap();
        tokio::spawn(async move { lock.write(Duration::from_secs(20)).await })
    };
    // The marker is set once B's own new readers are turned away (B reads
    // the lock at each attempt; a reader granted before is given back).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match readers.try_read().await {
            Ok(early) => early.release().await.unwrap(),
            Err(Error::Busy { .. }) => break,
            Err(e) => panic!("a reader beside r1: {e:?}"),
        }
        assert!(Instant::now() < deadline, "the writer sets its marker");
        sleep(Duration::from_millis(20)).await;
    }
    let lock = a.rw_lock(k.as_str()).unwrap();
    assert!(
        answered_busy(&lock.try_read().await),
        "the marker turns readers away"
    );
    assert!(answered_busy(&lock.try_read().await), "also after a look");
    let r1_token = r1.token();
    r1.release().await.unwrap();
    let w = writer.await.unwrap().expect("the writer gets the lock");
    let w_token = w.token();
    assert!(w_token > r1_token);
    assert!(answered_busy(&lock.try_read().await), "the writer holds it");
    w.release().await.unwrap();
    let after = lock.try_read().await.unwrap();
    assert_eq!(after.slot(), Some(0));
    assert!(after.token() > w_token);
    after.release().await.unwrap();
}

/// A waiting writer's release wakes: a reader released by another client
/// hands the lock to a writer waiting through the core long before the
/// reader's ttl; and the writer's release wakes waiting readers.
pub async fn rw_release_wakes_a_waiter(store: &TestStore) {
    let k = key(format!("{}rw", prefix()));
    let other = store.second_client();
    let reader = grant(other, &k, LONG, RwSide::Read).await;
    let lock = store.locks().rw_lock(k.as_str()).unwrap();
    let waiter = async move { lock.write(Duration::from_secs(20)).await };
    let guard = handed_off(waiter, other, &reader, "the waiter gets the lock").await;
    assert!(guard.token() > reader.token());
    guard.release().await.unwrap();
}

/// Bad input fails with `InvalidInput` before any I/O: nothing reaches
/// the store.
pub async fn rw_bad_input_rejected_before_io(store: &TestStore) {
    let locks = store.locks();
    let p = prefix();
    for bad in ["", "a\nb", &"k".repeat(300)] {
        assert!(matches!(
            locks.rw_lock(bad),
            Err(Error::InvalidInput { what: "key", .. })
        ));
    }
    let lock = locks.rw_lock(&format!("{p}rw")).unwrap();
    for ttl in [Duration::ZERO, Duration::from_millis(99), Duration::MAX] {
        let options = AcquireOptions::new().with_ttl(ttl);
        for outcome in [
            lock.read_with(&options).await,
            lock.write_with(&options).await,
        ] {
            match outcome {
                Err(Error::InvalidInput { what: "ttl", .. }) => {}
                other => panic!("ttl {ttl:?}: expected InvalidInput, got {other:?}"),
            }
        }
    }
    assert!(permits_listed(store.backend.as_ref(), &p)
        .await
        .unwrap()
        .is_empty());
}
