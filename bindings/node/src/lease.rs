//! `NativeLease`: a held lease, its lost-lease notification and its
//! optional bound on the total holding time.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use leasehold::{Error, LeaseGuard};
use napi::bindgen_prelude::{BigInt, Function};
use napi::threadsafe_function::ThreadsafeFunctionCallMode;
use napi_derive::napi;
use tokio_util::sync::CancellationToken;

use crate::errors::js;
use crate::locks::{lock, Shared};

/// The guard of one lease, shared by its JS object and `close()`.
pub(crate) struct LeaseSlot {
    key: String,
    token: u64,
    /// `None` once released (by the caller, `close()` or the hold bound).
    guard: Mutex<Option<LeaseGuard>>,
    /// Ends the lost-lease watcher when the lease is released.
    stop_watch: CancellationToken,
}

impl LeaseSlot {
    pub fn new(guard: LeaseGuard) -> Arc<Self> {
        Arc::new(LeaseSlot {
            key: guard.key().to_string(),
            token: guard.token(),
            guard: Mutex::new(Some(guard)),
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

/// The native lease behind the JS `Lease` class.
#[napi]
pub struct NativeLease {
    slot: Arc<LeaseSlot>,
    shared: Arc<Shared>,
}

impl NativeLease {
    pub(crate) fn new(slot: Arc<LeaseSlot>, shared: Arc<Shared>) -> Self {
        NativeLease { slot, shared }
    }
}

#[napi]
impl NativeLease {
    /// The locked key.
    #[napi(getter)]
    pub fn key(&self) -> String {
        self.slot.key.clone()
    }

    /// The fencing token, larger than every earlier grant of this key.
    #[napi(getter)]
    pub fn token(&self) -> BigInt {
        BigInt::from(self.slot.token)
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
        if self.slot.is_lost() {
            return Err(js(Error::LeaseLost {
                key: self.slot.key.clone(),
            }));
        }
        Ok(())
    }

    /// Releases the lease; false if it was no longer held by this object.
    #[napi]
    pub async fn release(&self) -> napi::Result<bool> {
        let released = self.slot.release().await;
        self.shared.forget(&self.slot);
        released.map_err(js)
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
        let shared = Arc::downgrade(&self.shared);
        let bound = max_hold_ms
            .filter(|ms| ms.is_finite())
            .map(|ms| Duration::from_secs_f64(ms.max(0.0) / 1000.0));
        napi::bindgen_prelude::spawn(async move {
            let by_bound = tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                _ = lost => false,
                _ = sleep_or_never(bound) => {
                    end_by_bound(&slot, &shared).await;
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
async fn end_by_bound(slot: &Weak<LeaseSlot>, shared: &Weak<Shared>) {
    let Some(slot) = slot.upgrade() else { return };
    // Best effort: if the store is down the lease expires after its ttl.
    let _ = slot.release().await;
    if let Some(shared) = shared.upgrade() {
        shared.forget(&slot);
    }
}
