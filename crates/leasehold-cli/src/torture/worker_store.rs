//! The store as a torture worker sees it: the real backend, wrapped so the
//! history records what the guard's background task does (every renewal
//! request and its outcome) and when the granted acquire request was sent,
//! and, for the harness's own tests only, a deliberately broken renew.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use leasehold::backend::{Acquire, AcquireRequest, BoxFuture};
use leasehold::backends::decorator::Decorator;
use leasehold::{Backend, Lease, Result};

use super::clock::mono_ns;
use super::history::Log;
use super::history::{Kind, Op};

/// A fault planted in the workers' store client to show that the checker
/// catches it. NOT a feature: selected only by the hidden `--test-fault`
/// flag, which the harness's tests use, and printed in every report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TestFault {
    /// Renew answers "renewed" without asking the store, as a backend whose
    /// renew ignores the owner and revives expired leases would: the holder
    /// keeps trusting a lease the store let go.
    BrokenRenew,
}

impl TestFault {
    /// The flag value, as `--test-fault` takes it.
    pub fn name(self) -> &'static str {
        match self {
            TestFault::BrokenRenew => "broken-renew",
        }
    }
}

#[derive(Debug)]
pub struct WorkerStore {
    inner: Arc<dyn Backend>,
    log: Log,
    fault: Option<TestFault>,
    /// When the latest `try_acquire` was sent (monotonic ns).
    last_attempt: Arc<AtomicU64>,
}

impl WorkerStore {
    pub fn new(inner: Arc<dyn Backend>, log: Log, fault: Option<TestFault>) -> Self {
        WorkerStore {
            inner,
            log,
            fault,
            last_attempt: Arc::default(),
        }
    }

    /// Reads when the latest acquire request was sent; right after an
    /// acquire returned a guard, that is the granted request.
    pub fn last_attempt(&self) -> Arc<AtomicU64> {
        self.last_attempt.clone()
    }

    fn renew_event(&self, lease: &Lease, kind: Kind, error: Option<String>) {
        let mut e = self.log.event(Op::Renew, kind, lease.key().as_str());
        e.token = Some(lease.token());
        e.error = error;
        // A history line lost to a full disk must not fail the renewal.
        let _ = self.log.put(e);
    }
}

impl Decorator for WorkerStore {
    fn inner(&self) -> &dyn Backend {
        self.inner.as_ref()
    }

    fn try_acquire<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Acquire>> {
        self.last_attempt.store(mono_ns(), Ordering::SeqCst);
        self.inner.try_acquire(req)
    }

    fn renew<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> BoxFuture<'a, Result<bool>> {
        Box::pin(self.logged_renew(lease, self.inner.renew(lease, ttl)))
    }

    /// A grant made inside another guard's release (a waiter of this
    /// process) was asked for when that release was sent.
    fn release_to<'a>(
        &'a self,
        lease: &'a Lease,
        next: &'a AcquireRequest,
    ) -> BoxFuture<'a, Result<Option<Lease>>> {
        self.last_attempt.store(mono_ns(), Ordering::SeqCst);
        self.inner.release_to(lease, next)
    }
}

impl WorkerStore {
    /// Logs a renewal request and its outcome; the planted fault answers
    /// without sending it.
    async fn logged_renew(
        &self,
        lease: &Lease,
        renew: BoxFuture<'_, Result<bool>>,
    ) -> Result<bool> {
        self.renew_event(lease, Kind::Invoke, None);
        let outcome = match self.fault {
            Some(TestFault::BrokenRenew) => Ok(true),
            None => renew.await,
        };
        match &outcome {
            Ok(true) => self.renew_event(lease, Kind::Ok, None),
            Ok(false) => self.renew_event(lease, Kind::Fail, Some("lease gone".into())),
            Err(e) => self.renew_event(lease, Kind::Unknown, Some(e.to_string())),
        }
        outcome
    }
}
