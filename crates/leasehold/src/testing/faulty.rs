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
    /// [`Backend::announce`].
    Announce,
}

impl Op {
    /// Every operation.
    pub const ALL: [Op; OPS] = [
        Op::TryAcquire,
        Op::Renew,
        Op::Release,
        Op::Inspect,
        Op::List,
        Op::ForceRelease,
        Op::Subscribe,
        Op::Announce,
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
    /// Delivers the request to the store twice and answers the second
    /// answer, as a client library does when it re-sends a command after
    /// a dropped connection or a timeout (the first was executed, its
    /// answer lost).
    Twice,
}

#[derive(Debug)]
struct Plan {
    fault: Fault,
    /// How many more calls it applies to; `None`: every call.
    left: Option<u32>,
}

/// How many operations [`Op`] names: every [`Backend`] method that reaches
/// the store (not `shutdown`).
const OPS: usize = 8;

#[derive(Debug, Default)]
struct State {
    plans: Mutex<[Option<Plan>; OPS]>,
    calls: [AtomicU64; OPS],
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
        call: impl Fn() -> BoxFuture<'a, Result<T>> + Send + 'a,
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
            Some(Fault::Twice) => Box::pin(async move {
                // The first answer is lost on its way back, whatever it was.
                let _lost = call().await;
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
    /// A hand-off inside a release is a release: the same faults.
    fn release_to<'a>(
        &'a self,
        lease: &'a Lease,
        next: &'a AcquireRequest,
    ) -> BoxFuture<'a, Result<Option<Lease>>> {
        self.run(Op::Release, || self.inner.release_to(lease, next))
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
    // The operations below have defaults in `Decorator` that forward to
    // `inner`; they are overridden so that they too are counted and meet
    // faults (a store that is down fails its announcements too).
    fn announce<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool>> {
        self.run(Op::Announce, || self.inner.announce(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::OwnerId;

    /// Calls `op` on `store` once; `Ok` when the call reached a working store.
    async fn call(store: &Faulty, op: Op) -> Result<()> {
        let key = Key::new("k")?;
        let req = AcquireRequest::new(key.clone(), Duration::from_secs(5), "t")?
            .with_owner(OwnerId::random());
        let backend: &dyn Backend = store;
        match op {
            Op::TryAcquire => backend.try_acquire(&req).await.map(drop),
            Op::Renew => backend.renew(&req.granted(1), req.ttl()).await.map(drop),
            Op::Release => backend.release(&req.granted(1)).await,
            Op::Inspect => backend.inspect(&key).await.map(drop),
            Op::List => backend.list("").await.map(drop),
            Op::ForceRelease => backend.force_release(&key).await.map(drop),
            Op::Subscribe => backend.subscribe(&key).await.map(drop),
            Op::Announce => {
                // The memory store announces: `true` proves the call got
                // through to it rather than to the trait's `Ok(false)`.
                assert!(backend.announce(&key).await?, "announce reached the store");
                Ok(())
            }
        }
    }

    #[tokio::test]
    async fn every_operation_is_counted_meets_its_fault_and_forwards() {
        let store = Faulty::default();
        for op in Op::ALL {
            let before = store.calls(op);
            call(&store, op)
                .await
                .unwrap_or_else(|e| panic!("{op:?}: {e}"));
            assert_eq!(store.calls(op), before + 1, "{op:?} counted");
            store.set(op, Fault::Unavailable("down".into()));
            let failed = call(&store, op).await;
            assert!(
                matches!(failed, Err(Error::Unavailable { .. })),
                "{op:?}: {failed:?}"
            );
            // Only `op` was switched: every other operation still works.
            for other in Op::ALL.into_iter().filter(|o| *o != op) {
                call(&store, other)
                    .await
                    .unwrap_or_else(|e| panic!("{other:?} while {op:?} fails: {e}"));
            }
            store.clear(op);
        }
        store.set_all(Fault::Unavailable("down".into()));
        for op in Op::ALL {
            assert!(call(&store, op).await.is_err(), "{op:?} under set_all");
        }
        store.recover();
        for op in Op::ALL {
            call(&store, op)
                .await
                .unwrap_or_else(|e| panic!("{op:?} after recover: {e}"));
        }
    }

    #[tokio::test]
    async fn twice_delivers_the_request_twice_and_answers_the_second() {
        let inner = Faulty::default();
        let store = Faulty::new(Arc::new(inner.clone()));
        store.set(Op::TryAcquire, Fault::Twice);
        let key = Key::new("k").unwrap();
        let req = AcquireRequest::permit(key, Duration::from_secs(5), "t", 2).unwrap();
        let answer = Backend::try_acquire(&store, &req).await.unwrap();
        assert!(matches!(answer, Acquire::Granted(_)), "{answer:?}");
        assert_eq!(store.calls(Op::TryAcquire), 1);
        assert_eq!(inner.calls(Op::TryAcquire), 2, "the store saw it twice");
    }
}
