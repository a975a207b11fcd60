//! The engine's dispatch of a request or lease to the store operation of
//! its kind: the mutex's, or the permit operations (semaphore permits and
//! reader-writer grants). The acquisition loop (`lock.rs`) and the guard
//! (`guard.rs`) call these, so neither depends on a primitive.

use std::time::Duration;

use crate::backend::{Acquire, AcquireRequest, Backend, Lease};
use crate::error::Result;

/// One attempt at the store for `request`: a permit if it names permits,
/// else the mutex.
pub(crate) async fn try_acquire_any(
    backend: &dyn Backend,
    request: &AcquireRequest,
) -> Result<Acquire> {
    if request.permit_kind().is_some() {
        backend.try_acquire_permit(request).await
    } else {
        backend.try_acquire(request).await
    }
}

/// Renews `lease`, a permit or a mutex lease.
pub(crate) async fn renew_any(backend: &dyn Backend, lease: &Lease, ttl: Duration) -> Result<bool> {
    if lease.slot().is_some() {
        backend.renew_permit(lease, ttl).await
    } else {
        backend.renew(lease, ttl).await
    }
}

/// Releases `lease`, a permit or a mutex lease.
pub(crate) async fn release_any(backend: &dyn Backend, lease: &Lease) -> Result<()> {
    if lease.slot().is_some() {
        backend.release_permit(lease).await
    } else {
        backend.release(lease).await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::backend::{
        Acquire, AcquireRequest, Backend, BoxFuture, Lease, LeaseInfo, PermitInfo, Subscription,
    };
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
            Box::pin(async move { Ok(Acquire::Granted(req.granted(1))) })
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
        fn try_acquire_permit<'a>(
            &'a self,
            req: &'a AcquireRequest,
        ) -> BoxFuture<'a, Result<Acquire>> {
            self.called("try_acquire_permit");
            Box::pin(async move { Ok(Acquire::Granted(req.granted_permit(0, 1))) })
        }
        fn renew_permit<'a>(&'a self, _: &'a Lease, _: Duration) -> BoxFuture<'a, Result<bool>> {
            self.called("renew_permit");
            Box::pin(async { Ok(true) })
        }
        fn release_permit<'a>(&'a self, _: &'a Lease) -> BoxFuture<'a, Result<()>> {
            self.called("release_permit");
            Box::pin(async { Ok(()) })
        }
        fn list_permits<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Vec<PermitInfo>>> {
            self.called("list_permits");
            Box::pin(async { Ok(Vec::new()) })
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
        for permits in [0, crate::MAX_PERMITS + 1] {
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
        // Both sides of a reader-writer lock go to the permit operations,
        // and their leases say which side they hold.
        for side in [crate::RwSide::Read, crate::RwSide::Write] {
            let guard = match side {
                crate::RwSide::Read => rw.try_read().await.unwrap(),
                crate::RwSide::Write => rw.try_write().await.unwrap(),
            };
            assert_eq!(guard.rw_side(), Some(side));
            guard.release().await.unwrap();
        }
        assert_eq!(
            std::mem::take(&mut *recording.0.lock().unwrap()),
            [
                "try_acquire_permit",
                "release_permit",
                "try_acquire_permit",
                "release_permit"
            ]
        );
        // A permit goes to the permit operations, a mutex to the mutex's.
        let permit = sem.try_acquire().await.unwrap();
        assert_eq!(permit.slot(), Some(0));
        permit.release().await.unwrap();
        assert_eq!(
            std::mem::take(&mut *recording.0.lock().unwrap()),
            ["try_acquire_permit", "release_permit"]
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
}
