//! `NativeLease`: a held lease (a mutex lease, a semaphore permit, a set of
//! keys or a term as leader), its lost-lease notification and its optional
//! bound on the total holding time.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use leasehold::{Error, Leadership, LeaseGuard, MultiGuard};
use napi::bindgen_prelude::{BigInt, Function};
use napi::threadsafe_function::ThreadsafeFunctionCallMode;
use napi::Env;
use napi_derive::napi;
use tokio_util::sync::CancellationToken;

use crate::errors::js;
use crate::settle::{settle, Settled};

/// What a `NativeLease` holds: every primitive ends up as one or more
/// renewed leases, so one native class (and one JS watcher) serves them all.
pub(crate) enum Held {
    /// A mutex lease or a semaphore permit.
    One(LeaseGuard),
    /// Every key of an `acquireMany`.
    Many(MultiGuard),
    /// A term as an election's leader.
    Leader(Leadership),
}

impl Held {
    fn is_lost(&self) -> bool {
        match self {
            Held::One(g) => g.is_lost(),
            Held::Many(m) => m.is_lost(),
            Held::Leader(l) => l.guard().is_lost(),
        }
    }

    fn check(&self) -> leasehold::Result<()> {
        match self {
            Held::One(g) => g.check(),
            Held::Many(m) => m.check(),
            Held::Leader(l) => l.guard().check(),
        }
    }

    fn lost(&self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        match self {
            Held::One(g) => Box::pin(g.lost()),
            Held::Many(m) => Box::pin(m.lost()),
            Held::Leader(l) => Box::pin(l.lost()),
        }
    }

    async fn release(self) -> leasehold::Result<()> {
        match self {
            Held::One(g) => g.release().await,
            Held::Many(m) => m.release().await,
            Held::Leader(l) => l.resign().await,
        }
    }
}

/// The guard of one lease, shared by its JS object and `close()`.
pub(crate) struct LeaseSlot {
    /// The keys held, in canonical order for a set (one key otherwise).
    keys: Vec<String>,
    /// The fencing token of each of `keys`.
    tokens: Vec<u64>,
    /// The permit's slot, for a semaphore permit.
    permit: Option<u32>,
    /// `None` once released (by the caller, `close()` or the hold bound).
    guard: Mutex<Option<Held>>,
    /// Ends the lost-lease watcher when the lease is released.
    stop_watch: CancellationToken,
}

impl LeaseSlot {
    pub fn new(held: Held) -> Arc<Self> {
        let one = |g: &LeaseGuard| (vec![g.key().to_string()], vec![g.token()], g.slot());
        let (keys, tokens, permit) = match &held {
            Held::One(g) => one(g),
            Held::Leader(l) => one(l.guard()),
            Held::Many(m) => {
                let (keys, tokens) = m.tokens().map(|(k, t)| (k.to_string(), t)).unzip();
                (keys, tokens, None)
            }
        };
        Arc::new(LeaseSlot {
            keys,
            tokens,
            permit,
            guard: Mutex::new(Some(held)),
            stop_watch: CancellationToken::new(),
        })
    }

    /// Releases the lease at the store; false if it was already released.
    pub async fn release(&self) -> leasehold::Result<bool> {
        let guard = lock(&self.guard).take();
        self.stop_watch.cancel();
        match guard {
            Some(guard) => guard.release().await.map(|()| true),
            None => Ok(false),
        }
    }

    fn is_lost(&self) -> bool {
        match lock(&self.guard).as_ref() {
            Some(guard) => guard.is_lost(),
            None => true,
        }
    }
}

/// Poison-tolerant lock: a panic elsewhere must not take the handle down.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The leases of one `Locks` object not yet released, for `close()`.
/// Weak: a lease whose JS object was garbage-collected is dropped (renewal
/// stops, it expires).
#[derive(Default)]
pub(crate) struct HeldLeases(Mutex<Vec<Weak<LeaseSlot>>>);

impl HeldLeases {
    pub(crate) fn track(&self, slot: &Arc<LeaseSlot>) {
        lock(&self.0).push(Arc::downgrade(slot));
    }

    pub(crate) fn forget(&self, slot: &Arc<LeaseSlot>) {
        let target = Arc::downgrade(slot);
        lock(&self.0).retain(|s| s.strong_count() > 0 && !s.ptr_eq(&target));
    }

    /// Every lease still tracked, and none tracked from now on.
    pub(crate) fn take_all(&self) -> Vec<Arc<LeaseSlot>> {
        std::mem::take(&mut *lock(&self.0))
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }
}

/// The native lease behind the JS `Lease` class.
#[napi]
pub struct NativeLease {
    slot: Arc<LeaseSlot>,
    /// The granting `Locks` object's leases: a release leaves them.
    held: Arc<HeldLeases>,
}

impl NativeLease {
    pub(crate) fn new(slot: Arc<LeaseSlot>, held: Arc<HeldLeases>) -> Self {
        NativeLease { slot, held }
    }
}

#[napi]
impl NativeLease {
    /// The locked key (the first in canonical order for a set).
    #[napi(getter)]
    pub fn key(&self) -> String {
        self.slot.keys[0].clone()
    }

    /// The fencing token, larger than every earlier grant of this key.
    #[napi(getter)]
    pub fn token(&self) -> BigInt {
        BigInt::from(self.slot.tokens[0])
    }

    /// The permit's slot (`0..permits`); none unless a semaphore permit.
    #[napi(getter)]
    pub fn slot(&self) -> Option<u32> {
        self.slot.permit
    }

    /// Every key held, in canonical (sorted) order.
    #[napi(getter)]
    pub fn keys(&self) -> Vec<String> {
        self.slot.keys.clone()
    }

    /// The fencing token of each of [`keys`](Self::keys).
    #[napi(getter)]
    pub fn tokens(&self) -> Vec<BigInt> {
        self.slot.tokens.iter().map(|&t| BigInt::from(t)).collect()
    }

    /// Whether the lease can no longer be relied on (lost, released, or
    /// ended by its hold bound).
    #[napi]
    pub fn is_lost(&self) -> bool {
        self.slot.is_lost()
    }

    /// Throws `LEASEHOLD_LOST` if [`is_lost`](Self::is_lost).
    #[napi]
    pub fn check(&self) -> napi::Result<()> {
        match lock(&self.slot.guard).as_ref() {
            Some(held) => held.check().map_err(js),
            None => Err(js(Error::LeaseLost {
                key: self.slot.keys[0].clone(),
            })),
        }
    }

    /// Releases the lease; false if it was no longer held by this object.
    /// Answered on the JS thread when the release needs no wait there
    /// (settle.rs).
    #[napi(ts_return_type = "boolean | Promise<boolean>")]
    pub fn release<'env>(&self, env: &'env Env) -> napi::Result<Settled<'env, bool>> {
        let (slot, held) = (self.slot.clone(), self.held.clone());
        settle(env, async move {
            let released = slot.release().await;
            held.forget(&slot);
            released.map_err(js)
        })
    }

    /// Calls `on_lost(by_bound)` once, from the JS thread, when the lease is
    /// lost or `max_hold_ms` has passed (then the lease is released first
    /// and `by_bound` is true). The
    /// callback is weak: it never keeps the process alive, and the watcher
    /// holds the lease only weakly, so an abandoned lease is dropped.
    ///
    /// Returns true, and watches nothing, if the lease is lost already; a
    /// released lease is not watched either (a release is not a loss).
    #[napi]
    pub fn watch_lost(
        &self,
        on_lost: Function<bool, ()>,
        max_hold_ms: Option<f64>,
    ) -> napi::Result<bool> {
        let lost = match lock(&self.slot.guard).as_ref() {
            None => return Ok(false),
            Some(guard) if guard.is_lost() => return Ok(true),
            Some(guard) => guard.lost(),
        };
        let notify = on_lost
            .build_threadsafe_function::<bool>()
            .callee_handled::<false>()
            .weak::<true>()
            .build()?;
        let stop = self.slot.stop_watch.clone();
        let slot = Arc::downgrade(&self.slot);
        let held = Arc::downgrade(&self.held);
        let bound = max_hold_ms
            .filter(|ms| ms.is_finite())
            .map(|ms| Duration::from_secs_f64(ms.max(0.0) / 1000.0));
        napi::bindgen_prelude::spawn(async move {
            let by_bound = tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                _ = lost => false,
                _ = sleep_or_never(bound) => {
                    end_by_bound(&slot, &held).await;
                    true
                }
            };
            notify.call(by_bound, ThreadsafeFunctionCallMode::NonBlocking);
        });
        Ok(false)
    }
}

async fn sleep_or_never(bound: Option<Duration>) {
    match bound {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// The hold bound passed: stop renewing and hand the lease back.
async fn end_by_bound(slot: &Weak<LeaseSlot>, held: &Weak<HeldLeases>) {
    let Some(slot) = slot.upgrade() else { return };
    // Best effort: if the store is down the lease expires after its ttl.
    let _ = slot.release().await;
    if let Some(held) = held.upgrade() {
        held.forget(&slot);
    }
}
