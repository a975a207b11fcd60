//! `NativeLocks`: one store handle, the leases it granted (so `close()` can
//! release them) and the cancellation tokens of pending waits.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::{AcquireOptions, Error, Locks};
use napi::bindgen_prelude::BigInt;
use napi::Env;
use napi_derive::napi;
use tokio_util::sync::CancellationToken;

use crate::errors::js;
use crate::lease::{lock, Held, HeldLeases, LeaseSlot, NativeLease};
use crate::settle::{settle, Settled};

/// What one `Locks` object shares with the leases it granted.
pub(crate) struct Shared {
    pub locks: Locks,
    /// Cancelled by `close()`: parent of every wait's cancellation token.
    pub closed: CancellationToken,
    cancels: Mutex<HashMap<u32, CancellationToken>>,
    next_cancel: AtomicU32,
    /// Leases not yet released, for `close()`.
    pub held: Arc<HeldLeases>,
}

impl Shared {
    /// The options of one acquire; fails once `close()` ran.
    fn options(
        &self,
        ttl_ms: f64,
        wait_ms: f64,
        cancel_id: Option<u32>,
    ) -> napi::Result<AcquireOptions> {
        // Kept registered while waiting, so `cancel(id)` finds it.
        let cancel = cancel_id
            .and_then(|id| lock(&self.cancels).get(&id).cloned())
            .unwrap_or_else(|| self.closed.child_token());
        if self.closed.is_cancelled() {
            return Err(js(closed()));
        }
        Ok(AcquireOptions::new()
            .with_ttl(millis(ttl_ms))
            .with_wait(millis(wait_ms))
            .with_cancel(cancel))
    }

    /// Wraps what an acquire got into a lease this handle tracks.
    async fn granted(
        self: Arc<Self>,
        cancel_id: Option<u32>,
        acquired: leasehold::Result<Held>,
    ) -> napi::Result<NativeLease> {
        if let Some(id) = cancel_id {
            lock(&self.cancels).remove(&id);
        }
        let held = acquired.map_err(js)?;
        let slot = LeaseSlot::new(held);
        if self.closed.is_cancelled() {
            // close() ran while the store granted it: hand it straight back.
            let _ = slot.release().await;
            return Err(js(closed()));
        }
        self.held.track(&slot);
        Ok(NativeLease::new(slot, self.held.clone()))
    }
}

/// A lease as `inspect`/`list` report it.
#[napi(object, object_from_js = false)]
pub struct LeaseInfo {
    /// The key.
    pub key: String,
    /// The holder's label (`host:pid`).
    pub holder: String,
    /// The holder's fencing token.
    pub token: BigInt,
    /// The longest the lease can still last, by the store's clock.
    pub expires_in_ms: f64,
}

impl From<leasehold::LeaseInfo> for LeaseInfo {
    fn from(info: leasehold::LeaseInfo) -> Self {
        LeaseInfo {
            key: info.key.to_string(),
            holder: info.holder,
            token: BigInt::from(info.token),
            expires_in_ms: info.remaining.as_secs_f64() * 1000.0,
        }
    }
}

/// A semaphore permit as `holders` reports it.
#[napi(object, object_from_js = false)]
pub struct PermitInfo {
    /// The semaphore's key.
    pub key: String,
    /// The permit's slot, `0..permits`.
    pub slot: u32,
    /// The holder's label (`host:pid`).
    pub holder: String,
    /// The permit's fencing token.
    pub token: BigInt,
    /// The longest the permit can still last, by the store's clock.
    pub expires_in_ms: f64,
    /// A reader-writer lock's holder: `'read'` or `'write'`; none for a
    /// semaphore permit.
    pub side: Option<String>,
}

impl From<leasehold::PermitInfo> for PermitInfo {
    fn from(info: leasehold::PermitInfo) -> Self {
        PermitInfo {
            key: info.key.to_string(),
            slot: info.slot,
            holder: info.holder,
            token: BigInt::from(info.token),
            expires_in_ms: info.remaining.as_secs_f64() * 1000.0,
            side: info.rw.map(|side| {
                match side {
                    leasehold::RwSide::Read => "read",
                    leasehold::RwSide::Write => "write",
                }
                .to_owned()
            }),
        }
    }
}

/// An election's leader: the id it campaigned with and its term's token.
#[napi(object, object_from_js = false)]
pub struct LeaderInfo {
    /// The id the leader campaigned with.
    pub candidate: String,
    /// The fencing token of its term.
    pub token: BigInt,
}

impl From<leasehold::Leader> for LeaderInfo {
    fn from(leader: leasehold::Leader) -> Self {
        LeaderInfo {
            candidate: leader.candidate,
            token: BigInt::from(leader.token),
        }
    }
}

/// Follows an election's leader for the JS async iterator.
#[napi]
pub struct NativeObserver {
    observer: Arc<tokio::sync::Mutex<leasehold::Observer>>,
    shared: Arc<Shared>,
}

#[napi]
impl NativeObserver {
    /// The next leader (the current one first); none once the wait
    /// `cancel_id` is cancelled or the `Locks` closed, so a pending `next`
    /// never outlives the iterator's `return()` or `close()`.
    #[napi]
    pub async fn next(&self, cancel_id: u32) -> napi::Result<Option<LeaderInfo>> {
        let shared = self.shared.clone();
        let cancel = lock(&shared.cancels).get(&cancel_id).cloned();
        let Some(cancel) = cancel.filter(|_| !shared.closed.is_cancelled()) else {
            return Ok(None);
        };
        let observer = self.observer.clone();
        let next = tokio::select! {
            _ = cancel.cancelled() => None,
            next = async { observer.lock().await.next().await } => Some(next),
        };
        lock(&shared.cancels).remove(&cancel_id);
        next.transpose()
            .map(|l| l.map(LeaderInfo::from))
            .map_err(js)
    }
}

/// Milliseconds from JS: non-negative; infinity means "no bound".
fn millis(ms: f64) -> Duration {
    if ms.is_finite() {
        Duration::from_secs_f64(ms.max(0.0) / 1000.0)
    } else {
        Duration::MAX
    }
}

/// The native store handle behind the JS `Locks` class.
#[napi]
pub struct NativeLocks {
    shared: Arc<Shared>,
}

#[napi]
impl NativeLocks {
    /// Opens the store named by `url` (the CLI's URLs).
    #[napi(factory)]
    pub async fn open(url: String) -> napi::Result<NativeLocks> {
        crate::runtime::check_setting().map_err(js)?;
        // Renewal on the binding's own runtime (runtime.rs), which lives as
        // long as the process: no extra thread beside its workers.
        let locks = Locks::open(&url)
            .await
            .map_err(js)?
            .with_background_runtime(tokio::runtime::Handle::current());
        Ok(NativeLocks {
            shared: Arc::new(Shared {
                locks,
                closed: CancellationToken::new(),
                cancels: Mutex::default(),
                next_cancel: AtomicU32::new(1),
                held: Arc::default(),
            }),
        })
    }

    /// The Rust handle (for `stats.rs`).
    pub(crate) fn locks(&self) -> &Locks {
        &self.shared.locks
    }

    /// A cancellation handle for one acquire; `cancel(id)` ends its wait.
    #[napi]
    pub fn new_cancel(&self) -> u32 {
        let id = self.shared.next_cancel.fetch_add(1, Ordering::Relaxed);
        lock(&self.shared.cancels).insert(id, self.shared.closed.child_token());
        id
    }

    /// Cancels the wait registered as `id` (no-op once it finished).
    #[napi]
    pub fn cancel(&self, id: u32) {
        if let Some(token) = lock(&self.shared.cancels).get(&id) {
            token.cancel();
        }
    }

    /// Acquires `key`: tries once when `wait_ms` is 0, else waits up to
    /// `wait_ms` (infinity: no bound); `fair` waits in the key's queue at
    /// the store (`AcquireOptions::with_fair`).
    #[napi(ts_return_type = "NativeLease | Promise<NativeLease>")]
    pub fn acquire<'env>(
        &self,
        env: &'env Env,
        key: String,
        ttl_ms: f64,
        wait_ms: f64,
        cancel_id: Option<u32>,
        fair: Option<bool>,
    ) -> napi::Result<Settled<'env, NativeLease>> {
        let locks = self.shared.locks.clone();
        let fair = fair.unwrap_or(false);
        let call = move |options: AcquireOptions| async move {
            locks.acquire_with(&key, &options.with_fair(fair)).await
        };
        self.take(env, ttl_ms, wait_ms, cancel_id, call, Held::One)
    }

    /// Takes a permit of the semaphore `key` of `permits` permits, as
    /// [`acquire`](Self::acquire) waits.
    #[napi(ts_return_type = "NativeLease | Promise<NativeLease>")]
    pub fn acquire_permit<'env>(
        &self,
        env: &'env Env,
        key: String,
        permits: u32,
        ttl_ms: f64,
        wait_ms: f64,
        cancel_id: Option<u32>,
    ) -> napi::Result<Settled<'env, NativeLease>> {
        let semaphore = self.shared.locks.semaphore(&key, permits).map_err(js)?;
        let call = |options| async move { semaphore.acquire_with(&options).await };
        self.take(env, ttl_ms, wait_ms, cancel_id, call, Held::One)
    }

    /// The live permits of the semaphore `key`, by slot.
    #[napi]
    pub async fn holders(&self, key: String, permits: u32) -> napi::Result<Vec<PermitInfo>> {
        self.open_or_closed()?;
        let semaphore = self.shared.locks.semaphore(&key, permits).map_err(js)?;
        let holders = semaphore.holders().await.map_err(js)?;
        Ok(holders.into_iter().map(PermitInfo::from).collect())
    }

    /// Takes the reader-writer lock `key`: the exclusive (writer) grant
    /// when `write`, else a shared (reader) one, as
    /// [`acquire`](Self::acquire) waits.
    #[napi(ts_return_type = "NativeLease | Promise<NativeLease>")]
    pub fn acquire_rw<'env>(
        &self,
        env: &'env Env,
        key: String,
        write: bool,
        ttl_ms: f64,
        wait_ms: f64,
        cancel_id: Option<u32>,
    ) -> napi::Result<Settled<'env, NativeLease>> {
        let rw = self.shared.locks.rw_lock(&key).map_err(js)?;
        let call = |options| async move {
            if write {
                rw.write_with(&options).await
            } else {
                rw.read_with(&options).await
            }
        };
        self.take(env, ttl_ms, wait_ms, cancel_id, call, Held::One)
    }

    /// The live readers and writer of the reader-writer lock `key`.
    #[napi]
    pub async fn rw_holders(&self, key: String) -> napi::Result<Vec<PermitInfo>> {
        self.open_or_closed()?;
        let rw = self.shared.locks.rw_lock(&key).map_err(js)?;
        let holders = rw.holders().await.map_err(js)?;
        Ok(holders.into_iter().map(PermitInfo::from).collect())
    }

    /// Takes every key of `keys` or none, as [`acquire`](Self::acquire)
    /// waits (one wait bound for the whole set; `fair` queues at each key).
    #[napi(ts_return_type = "NativeLease | Promise<NativeLease>")]
    pub fn acquire_many<'env>(
        &self,
        env: &'env Env,
        keys: Vec<String>,
        ttl_ms: f64,
        wait_ms: f64,
        cancel_id: Option<u32>,
        fair: Option<bool>,
    ) -> napi::Result<Settled<'env, NativeLease>> {
        let locks = self.shared.locks.clone();
        let fair = fair.unwrap_or(false);
        let call = move |options: AcquireOptions| async move {
            locks.acquire_many(&keys, &options.with_fair(fair)).await
        };
        self.take(env, ttl_ms, wait_ms, cancel_id, call, Held::Many)
    }

    /// Campaigns as `candidate` in the election `key` until elected, as
    /// [`acquire`](Self::acquire) waits.
    #[napi(ts_return_type = "NativeLease | Promise<NativeLease>")]
    pub fn campaign<'env>(
        &self,
        env: &'env Env,
        key: String,
        candidate: String,
        ttl_ms: f64,
        wait_ms: f64,
        cancel_id: Option<u32>,
    ) -> napi::Result<Settled<'env, NativeLease>> {
        let election = self.shared.locks.election(&key).map_err(js)?;
        let call = |options| async move { election.campaign(&candidate, &options).await };
        self.take(env, ttl_ms, wait_ms, cancel_id, call, Held::Leader)
    }

    /// The current leader of the election `key`, if any.
    #[napi]
    pub async fn leader(&self, key: String) -> napi::Result<Option<LeaderInfo>> {
        self.open_or_closed()?;
        let election = self.shared.locks.election(&key).map_err(js)?;
        let leader = election.leader().await.map_err(js)?;
        Ok(leader.map(LeaderInfo::from))
    }

    /// Starts following the leader of the election `key`.
    #[napi]
    pub async fn observe(&self, key: String) -> napi::Result<NativeObserver> {
        self.open_or_closed()?;
        let election = self.shared.locks.election(&key).map_err(js)?;
        let observer = election.observe().await.map_err(js)?;
        Ok(NativeObserver {
            observer: Arc::new(tokio::sync::Mutex::new(observer)),
            shared: self.shared.clone(),
        })
    }

    /// The current lease of `key`, if any.
    #[napi]
    pub async fn inspect(&self, key: String) -> napi::Result<Option<LeaseInfo>> {
        self.open_or_closed()?;
        let info = self.shared.locks.inspect(&key).await.map_err(js)?;
        Ok(info.map(LeaseInfo::from))
    }

    /// Every live lease whose key starts with `prefix`.
    #[napi]
    pub async fn list(&self, prefix: String) -> napi::Result<Vec<LeaseInfo>> {
        self.open_or_closed()?;
        let infos = self.shared.locks.list(&prefix).await.map_err(js)?;
        Ok(infos.into_iter().map(LeaseInfo::from).collect())
    }

    /// Breaks whoever holds `key`; true if there was a lease.
    #[napi]
    pub async fn force_release(&self, key: String) -> napi::Result<bool> {
        self.open_or_closed()?;
        self.shared.locks.force_release(&key).await.map_err(js)
    }

    /// Ends every wait and releases every lease this handle holds.
    #[napi]
    pub async fn close(&self) -> napi::Result<()> {
        self.shared.closed.cancel();
        lock(&self.shared.cancels).clear();
        for slot in self.shared.held.take_all() {
            // Best effort: a lease that cannot be released expires by itself.
            let _ = slot.release().await;
        }
        Ok(())
    }

    fn open_or_closed(&self) -> napi::Result<()> {
        if self.shared.closed.is_cancelled() {
            Err(js(closed()))
        } else {
            Ok(())
        }
    }
}

impl NativeLocks {
    /// One acquire from start to finish: the options (failing once
    /// `close()` ran), the store's call, then the lease this handle tracks;
    /// answered on the JS thread when it finishes there (settle.rs).
    /// `call` takes the options by value so its future borrows nothing.
    fn take<'env, T, Fut>(
        &self,
        env: &'env Env,
        ttl_ms: f64,
        wait_ms: f64,
        cancel_id: Option<u32>,
        call: impl FnOnce(AcquireOptions) -> Fut,
        held: fn(T) -> Held,
    ) -> napi::Result<Settled<'env, NativeLease>>
    where
        T: Send + 'static,
        Fut: Future<Output = leasehold::Result<T>> + Send + 'static,
    {
        let shared = self.shared.clone();
        let options = shared.options(ttl_ms, wait_ms, cancel_id)?;
        let acquired = call(options);
        settle(env, async move {
            let acquired = acquired.await;
            shared.granted(cancel_id, acquired.map(held)).await
        })
    }
}

fn closed() -> Error {
    Error::invalid("call", "this Locks was closed")
}
