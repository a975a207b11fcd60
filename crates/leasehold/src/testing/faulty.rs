//! A backend whose operations fail, hang or answer late on command, and
//! which counts every call.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::backend::{Acquire, AcquireRequest, Backend, BoxFuture, Lease, LeaseInfo};
use crate::backends::decorator::Decorator;
use crate::backends::memory::MemoryBackend;
use crate::error::{Error, Result};
use crate::key::Key;
use crate::notify::Subscription;

/// A [`Backend`] operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// [`Backend::try_acquire`].
    TryAcquire,
    /// [`Backend::renew`].
    Renew,
    /// [`Backend::release`].
    Release,
    /// [`Backend::inspect`].
    Inspect,
    /// [`Backend::list`].
    List,
    /// [`Backend::force_release`].
    ForceRelease,
    /// [`Backend::subscribe`].
    Subscribe,
}

impl Op {
    /// Every operation.
    pub const ALL: [Op; 7] = [
        Op::TryAcquire,
        Op::Renew,
        Op::Release,
        Op::Inspect,
        Op::List,
        Op::ForceRelease,
        Op::Subscribe,
    ];

    fn index(self) -> usize {
        self as usize
    }
}

/// What a faulty operation does instead of (or before) asking the store.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Fault {
    /// Fails with [`Error::Unavailable`] carrying this message, as a store
    /// that is down does.
    Unavailable(String),
    /// Never answers, as a request on a dead connection.
    Hang,
    /// Asks the store after this long (tokio's clock, so tests on paused
    /// time see exact instants).
    Delay(Duration),
}

#[derive(Debug)]
struct Plan {
    fault: Fault,
    /// How many more calls it applies to; `None`: every call.
    left: Option<u32>,
}

#[derive(Debug, Default)]
struct State {
    plans: Mutex<[Option<Plan>; 7]>,
    calls: [AtomicU64; 7],
}

/// `inner` with faults switched on and off per operation from the test;
/// every call is counted, faulty or not. Clones share the switches.
#[derive(Debug, Clone)]
pub struct Faulty {
    inner: Arc<dyn Backend>,
    state: Arc<State>,
}

impl Default for Faulty {
    /// Over a fresh [`MemoryBackend`].
    fn default() -> Self {
        Faulty::new(Arc::new(MemoryBackend::new()))
    }
}

impl Faulty {
    /// Wraps `inner`, with no fault yet.
    pub fn new(inner: Arc<dyn Backend>) -> Self {
        Faulty {
            inner,
            state: Arc::default(),
        }
    }

    /// Every call of `op` from now on meets `fault`.
    pub fn set(&self, op: Op, fault: Fault) {
        self.plan(op, Some(Plan { fault, left: None }));
    }

    /// The next `times` calls of `op` meet `fault`; later ones do not.
    pub fn set_next(&self, op: Op, times: u32, fault: Fault) {
        let left = Some(times);
        self.plan(op, Some(Plan { fault, left }));
    }

    /// Every call of every operation from now on meets `fault`.
    pub fn set_all(&self, fault: Fault) {
        for op in Op::ALL {
            self.set(op, fault.clone());
        }
    }

    /// `op` works normally again.
    pub fn clear(&self, op: Op) {
        self.plan(op, None);
    }

    /// Every operation works normally again.
    pub fn recover(&self) {
        for op in Op::ALL {
            self.clear(op);
        }
    }

    /// How many times `op` was called so far.
    pub fn calls(&self, op: Op) -> u64 {
        self.state.calls[op.index()].load(Ordering::SeqCst)
    }

    fn plan(&self, op: Op, plan: Option<Plan>) {
        self.state.plans.lock().expect("not poisoned")[op.index()] = plan;
    }

    /// Counts the call and takes the fault it meets, if any.
    fn fault_for(&self, op: Op) -> Option<Fault> {
        self.state.calls[op.index()].fetch_add(1, Ordering::SeqCst);
        let mut plans = self.state.plans.lock().expect("not poisoned");
        let slot = &mut plans[op.index()];
        let plan = slot.as_mut()?;
        let fault = plan.fault.clone();
        match &mut plan.left {
            None => {}
            Some(1) => *slot = None,
            Some(left) => *left -= 1,
        }
        Some(fault)
    }

    fn run<'a, T: Send + 'a>(
        &'a self,
        op: Op,
        call: impl FnOnce() -> BoxFuture<'a, Result<T>> + Send + 'a,
    ) -> BoxFuture<'a, Result<T>> {
        match self.fault_for(op) {
            None => call(),
            Some(Fault::Unavailable(message)) => {
                Box::pin(async move { Err(Error::unavailable(message)) })
            }
            Some(Fault::Hang) => Box::pin(std::future::pending()),
            Some(Fault::Delay(delay)) => Box::pin(async move {
                tokio::time::sleep(delay).await;
                call().await
            }),
        }
    }
}

impl Decorator for Faulty {
    fn inner(&self) -> &dyn Backend {
        self.inner.as_ref()
    }
    fn try_acquire<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Acquire>> {
        self.run(Op::TryAcquire, || self.inner.try_acquire(req))
    }
    fn renew<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> BoxFuture<'a, Result<bool>> {
        self.run(Op::Renew, move || self.inner.renew(lease, ttl))
    }
    fn release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<()>> {
        self.run(Op::Release, || self.inner.release(lease))
    }
    fn inspect<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<LeaseInfo>>> {
        self.run(Op::Inspect, || self.inner.inspect(key))
    }
    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<LeaseInfo>>> {
        self.run(Op::List, || self.inner.list(prefix))
    }
    fn force_release<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool>> {
        self.run(Op::ForceRelease, || self.inner.force_release(key))
    }
    fn subscribe<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Subscription>> {
        self.run(Op::Subscribe, || self.inner.subscribe(key))
    }
}
