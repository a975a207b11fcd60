//! The core validates every input before a store sees it, and sends each
//! request and lease, whatever its kind, to the one store operation of
//! the trait's one family: a backend that records its calls shows both.

use std::time::Duration;

use crate::backend::{Acquire, AcquireRequest, Backend, BoxFuture, Lease, LeaseInfo, Subscription};
use crate::error::Result;
use crate::key::Key;

/// A backend that records every call and answers like an empty store.
#[derive(Debug, Default)]
struct Recording(std::sync::Mutex<Vec<&'static str>>);

impl Recording {
    fn called(&self, op: &'static str) {
        self.0.lock().unwrap().push(op);
    }
}

impl Backend for std::sync::Arc<Recording> {
    fn try_acquire<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Acquire>> {
        self.called("try_acquire");
        Box::pin(async move {
            Ok(Acquire::Granted(match req.permit_kind() {
                None => req.granted(1),
                Some(_) => req.granted_permit(0, 1),
            }))
        })
    }
    fn renew<'a>(&'a self, _: &'a Lease, _: Duration) -> BoxFuture<'a, Result<bool>> {
        self.called("renew");
        Box::pin(async { Ok(true) })
    }
    fn release<'a>(&'a self, _: &'a Lease) -> BoxFuture<'a, Result<()>> {
        self.called("release");
        Box::pin(async { Ok(()) })
    }
    fn inspect<'a>(&'a self, _: &'a Key) -> BoxFuture<'a, Result<Option<LeaseInfo>>> {
        self.called("inspect");
        Box::pin(async { Ok(None) })
    }
    fn list<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Vec<LeaseInfo>>> {
        self.called("list");
        Box::pin(async { Ok(Vec::new()) })
    }
    fn force_release<'a>(&'a self, _: &'a Key) -> BoxFuture<'a, Result<bool>> {
        self.called("force_release");
        Box::pin(async { Ok(false) })
    }
    fn subscribe<'a>(&'a self, _: &'a Key) -> BoxFuture<'a, Result<Subscription>> {
        self.called("subscribe");
        Box::pin(async { Ok(Subscription::never()) })
    }
}

/// Backends do no validation of their own (the contract): the core
/// rejects a bad ttl, key or list prefix before any backend call, and
/// a lease (whose ttl renewals reuse) exists only with a checked ttl.
#[tokio::test]
async fn locks_validate_before_reaching_the_backend() {
    use crate::error::Error;
    use crate::lock::{AcquireOptions, Locks};

    let recording = std::sync::Arc::new(Recording::default());
    let locks = Locks::new(recording.clone());
    for ttl in [
        Duration::ZERO,
        Duration::from_millis(99),
        Duration::from_secs(86_401),
    ] {
        let options = AcquireOptions::new().with_ttl(ttl);
        let refused = locks.acquire_with("k", &options).await;
        assert!(matches!(
            refused,
            Err(Error::InvalidInput { what: "ttl", .. })
        ));
    }
    for prefix in ["x\u{7}", &"p".repeat(257)] {
        let refused = locks.list(prefix).await;
        assert!(matches!(
            refused,
            Err(Error::InvalidInput { what: "prefix", .. })
        ));
    }
    for bad in ["", "a\nb"] {
        assert!(locks.inspect(bad).await.is_err());
        assert!(locks.force_release(bad).await.is_err());
        assert!(locks.try_acquire(bad).await.is_err());
    }
    for permits in [0, crate::backend::MAX_PERMITS + 1] {
        assert!(locks.semaphore("k", permits).is_err());
    }
    assert!(locks.semaphore("", 3).is_err());
    let sem = locks.semaphore("k", 3).unwrap();
    let bad_ttl = AcquireOptions::new().with_ttl(Duration::ZERO);
    assert!(sem.acquire_with(&bad_ttl).await.is_err());
    assert!(locks.list_permits("x\u{7}").await.is_err());
    assert!(locks.rw_lock("").is_err());
    let rw = locks.rw_lock("k").unwrap();
    assert!(rw.read_with(&bad_ttl).await.is_err());
    assert!(rw.write_with(&bad_ttl).await.is_err());
    assert_eq!(*recording.0.lock().unwrap(), Vec::<&str>::new());
    // Both sides of a reader-writer lock go to the one family of store
    // operations, and their leases say which side they hold.
    for side in [crate::backend::RwSide::Read, crate::backend::RwSide::Write] {
        let guard = match side {
            crate::backend::RwSide::Read => rw.try_read().await.unwrap(),
            crate::backend::RwSide::Write => rw.try_write().await.unwrap(),
        };
        assert_eq!(guard.rw_side(), Some(side));
        guard.release().await.unwrap();
    }
    assert_eq!(
        std::mem::take(&mut *recording.0.lock().unwrap()),
        ["try_acquire", "release", "try_acquire", "release"]
    );
    // A permit goes to the same operations, its lease saying its slot.
    let permit = sem.try_acquire().await.unwrap();
    assert_eq!(permit.slot(), Some(0));
    permit.release().await.unwrap();
    assert_eq!(
        std::mem::take(&mut *recording.0.lock().unwrap()),
        ["try_acquire", "release"]
    );
    // The same calls with good input do reach it.
    locks.list("x").await.unwrap();
    let guard = locks.try_acquire("k").await.unwrap();
    assert_eq!(guard.lease().ttl(), crate::time::DEFAULT_TTL);
    guard.release().await.unwrap();
    assert_eq!(
        *recording.0.lock().unwrap(),
        ["list", "try_acquire", "release"]
    );
}
