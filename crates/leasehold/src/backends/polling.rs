//! A wrapper store whose waiters poll instead of waiting for notifications.
//!
//! For measuring what notifications buy (`leasehold bench` compares the two),
//! and for deployments where the store's notification channel is not
//! available (a proxy that drops `LISTEN`, a Redis without pub/sub).

use std::sync::Arc;
use std::time::Duration;

use crate::backend::{Acquire, AcquireRequest, Backend, BoxFuture, Lease, LeaseInfo};
use crate::error::Result;
use crate::key::Key;
use crate::notify::Subscription;

/// `inner` with [`Backend::subscribe`] answering [`Subscription::never`]:
/// waiters wake only at the holder's expiry or their backoff.
#[derive(Debug, Clone)]
pub struct PollingOnly {
    inner: Arc<dyn Backend>,
}

impl PollingOnly {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Backend>) -> Self {
        PollingOnly { inner }
    }
}

impl Backend for PollingOnly {
    fn try_acquire<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Acquire>> {
        self.inner.try_acquire(req)
    }
    fn renew<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> BoxFuture<'a, Result<bool>> {
        self.inner.renew(lease, ttl)
    }
    fn release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<()>> {
        self.inner.release(lease)
    }
    fn inspect<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<LeaseInfo>>> {
        self.inner.inspect(key)
    }
    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<LeaseInfo>>> {
        self.inner.list(prefix)
    }
    fn force_release<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool>> {
        self.inner.force_release(key)
    }
    fn subscribe<'a>(&'a self, _key: &'a Key) -> BoxFuture<'a, Result<Subscription>> {
        Box::pin(async { Ok(Subscription::never()) })
    }
}
