//! The base of backend decorators: a wrapper that changes one or two
//! operations of another backend and passes the rest through.
//!
//! Implement [`Decorator`] (its [`inner`](Decorator::inner) and the
//! operations you change); every [`Decorator`] is a [`Backend`]. Without it
//! each wrapper repeats every method of [`Backend`] (nine, `shutdown`
//! included), and a new trait method would have to be added to every one.
//! Every method is forwarded, [`shutdown`](Decorator::shutdown) too: a
//! wrapper that kept the trait's do-nothing default would make
//! [`Locks::close`](crate::Locks::close) miss the store inside it.
//!
//! ```
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use leasehold::backends::decorator::Decorator;
//! use leasehold::backends::memory::MemoryBackend;
//! use leasehold::backend::BoxFuture;
//! use leasehold::{Backend, Lease, Locks, Result};
//!
//! /// Counts renewals; everything else goes to `inner` unchanged.
//! #[derive(Debug)]
//! struct CountRenewals {
//!     inner: Arc<dyn Backend>,
//!     renewals: AtomicU64,
//! }
//!
//! impl Decorator for CountRenewals {
//!     fn inner(&self) -> &dyn Backend {
//!         self.inner.as_ref()
//!     }
//!     fn renew<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> BoxFuture<'a, Result<bool>> {
//!         self.renewals.fetch_add(1, Ordering::Relaxed);
//!         self.inner.renew(lease, ttl)
//!     }
//! }
//!
//! let locks = Locks::new(CountRenewals {
//!     inner: Arc::new(MemoryBackend::new()),
//!     renewals: AtomicU64::new(0),
//! });
//! # drop(locks);
//! ```

use std::fmt::Debug;
use std::time::Duration;

use crate::backend::{Acquire, AcquireRequest, Backend, BoxFuture, Lease, LeaseInfo, OwnerId};
use crate::error::Result;
use crate::key::Key;
use crate::notify::Subscription;

/// A backend that wraps [`inner`](Decorator::inner): each operation goes
/// there unless the decorator overrides it. See the [module docs](self).
///
/// The contract of [`Backend`] holds for what an override does: one atomic
/// operation on the store, no validation of its own.
pub trait Decorator: Debug + Send + Sync + 'static {
    /// The wrapped backend.
    fn inner(&self) -> &dyn Backend;

    /// [`Backend::try_acquire`]; by default `inner`'s.
    fn try_acquire<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Acquire>> {
        self.inner().try_acquire(req)
    }
    /// [`Backend::renew`]; by default `inner`'s.
    fn renew<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> BoxFuture<'a, Result<bool>> {
        self.inner().renew(lease, ttl)
    }
    /// [`Backend::release`]; by default `inner`'s.
    fn release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<()>> {
        self.inner().release(lease)
    }
    /// [`Backend::inspect`]; by default `inner`'s.
    fn inspect<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<LeaseInfo>>> {
        self.inner().inspect(key)
    }
    /// [`Backend::list`]; by default `inner`'s.
    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<LeaseInfo>>> {
        self.inner().list(prefix)
    }
    /// [`Backend::force_release`]; by default `inner`'s.
    fn force_release<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool>> {
        self.inner().force_release(key)
    }
    /// [`Backend::subscribe`]; by default `inner`'s.
    fn subscribe<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Subscription>> {
        self.inner().subscribe(key)
    }
    /// [`Backend::announce`]; by default `inner`'s.
    fn announce<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool>> {
        self.inner().announce(key)
    }

    /// [`Backend::queues`]; by default `inner`'s.
    fn queues(&self) -> bool {
        self.inner().queues()
    }
    /// [`Backend::hands_over_locally`]; by default `inner`'s.
    fn hands_over_locally(&self) -> bool {
        self.inner().hands_over_locally()
    }
    /// [`Backend::release_to`]; by default `inner`'s.
    fn release_to<'a>(
        &'a self,
        lease: &'a Lease,
        next: &'a AcquireRequest,
    ) -> BoxFuture<'a, Result<Option<Lease>>> {
        self.inner().release_to(lease, next)
    }
    /// [`Backend::leave_queue`]; by default `inner`'s.
    fn leave_queue<'a>(&'a self, key: &'a Key, owner: OwnerId) -> BoxFuture<'a, Result<()>> {
        self.inner().leave_queue(key, owner)
    }

    /// [`Backend::shutdown`]; by default `inner`'s.
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        self.inner().shutdown()
    }
}

impl<D: Decorator> Backend for D {
    fn try_acquire<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Acquire>> {
        Decorator::try_acquire(self, req)
    }
    fn renew<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> BoxFuture<'a, Result<bool>> {
        Decorator::renew(self, lease, ttl)
    }
    fn release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<()>> {
        Decorator::release(self, lease)
    }
    fn inspect<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<LeaseInfo>>> {
        Decorator::inspect(self, key)
    }
    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<LeaseInfo>>> {
        Decorator::list(self, prefix)
    }
    fn force_release<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool>> {
        Decorator::force_release(self, key)
    }
    fn subscribe<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Subscription>> {
        Decorator::subscribe(self, key)
    }
    fn announce<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool>> {
        Decorator::announce(self, key)
    }

    fn queues(&self) -> bool {
        Decorator::queues(self)
    }
    fn leave_queue<'a>(&'a self, key: &'a Key, owner: OwnerId) -> BoxFuture<'a, Result<()>> {
        Decorator::leave_queue(self, key, owner)
    }
    fn hands_over_locally(&self) -> bool {
        Decorator::hands_over_locally(self)
    }
    fn release_to<'a>(
        &'a self,
        lease: &'a Lease,
        next: &'a AcquireRequest,
    ) -> BoxFuture<'a, Result<Option<Lease>>> {
        Decorator::release_to(self, lease, next)
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Decorator::shutdown(self)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::backends::memory::MemoryBackend;
    use crate::backends::polling::PollingOnly;

    /// A store whose shutdown leaves a mark.
    #[derive(Debug, Default)]
    struct MarksShutdown {
        inner: MemoryBackend,
        shut: AtomicBool,
    }

    impl Decorator for MarksShutdown {
        fn inner(&self) -> &dyn Backend {
            &self.inner
        }
        fn shutdown(&self) -> BoxFuture<'_, ()> {
            self.shut.store(true, Ordering::SeqCst);
            Box::pin(async {})
        }
    }

    #[tokio::test]
    async fn close_reaches_the_store_inside_a_decorator() {
        let store = Arc::new(MarksShutdown::default());
        let locks = crate::lock::Locks::new(PollingOnly::new(store.clone()));
        locks.close().await;
        assert!(
            store.shut.load(Ordering::SeqCst),
            "shutdown was not forwarded"
        );
    }
}
