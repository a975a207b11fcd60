//! A wrapper store whose waiters poll instead of waiting for notifications.
//!
//! For measuring what notifications buy (`leasehold bench` compares the two),
//! and for deployments where the store's notification channel is not
//! available (a proxy that drops `LISTEN`, a Redis without pub/sub).

use std::sync::Arc;

use super::decorator::Decorator;
use crate::backend::{Backend, BoxFuture};
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

impl Decorator for PollingOnly {
    fn inner(&self) -> &dyn Backend {
        self.inner.as_ref()
    }
    fn subscribe<'a>(&'a self, _key: &'a Key) -> BoxFuture<'a, Result<Subscription>> {
        Box::pin(async { Ok(Subscription::never()) })
    }
}
