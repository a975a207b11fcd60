//! Counting semaphores with a lease per permit: [`Semaphore`], made by
//! [`Locks::semaphore`].
//!
//! A permit is a lease like a mutex's and goes through the same engine:
//! the acquisition loop of [`Locks`] (validation, local queueing, store
//! wake-ups, deadlines) and [`LeaseGuard`] (renewal, `lost()`, release).
//! Only the store operation differs, chosen by the lease itself: a request
//! that names permits goes to [`Backend::try_acquire_permit`](crate::Backend::try_acquire_permit), a lease with
//! a slot is renewed and released with the `_permit` operations. The rules
//! (what a permit guarantees, which token to compare) are in
//! docs/semaphore.md.

use std::time::Duration;

use crate::backend::{validate_permits, AcquireRequest, LeaseInfo, PermitInfo};
use crate::error::Result;
use crate::guard::LeaseGuard;
use crate::key::Key;
use crate::lock::{AcquireOptions, Locks};

/// A counting semaphore: at most `permits` holders of `key` at once, each
/// with its own lease and fencing token. Cheap to clone.
///
/// ```
/// use leasehold::{backends::memory::MemoryBackend, Locks};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
///
/// let locks = Locks::new(MemoryBackend::new());
/// let workers = locks.semaphore("jobs:export", 2)?;
/// let a = workers.try_acquire().await?;
/// let b = workers.try_acquire().await?;
/// assert!(workers.try_acquire().await.is_err(), "only two permits");
/// assert_ne!(a.slot(), b.slot());
/// a.release().await?;
/// let c = workers.try_acquire().await?;
/// assert!(c.token() > b.token(), "tokens grow across the key");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Semaphore {
    locks: Locks,
    key: Key,
    permits: u32,
}

impl Locks {
    /// The semaphore `key` with `permits` permits. Semaphores live apart
    /// from mutexes: the mutex `key` is another lock.
    ///
    /// # Errors
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) (no I/O) for a bad key or `permits` outside
    /// 1 ..= [`MAX_PERMITS`](crate::MAX_PERMITS).
    pub fn semaphore(&self, key: &str, permits: u32) -> Result<Semaphore> {
        Ok(Semaphore {
            key: Key::new(key)?,
            permits: validate_permits(permits)?,
            locks: self.clone(),
        })
    }

    /// Live permits of every semaphore, and live readers and writers of
    /// every reader-writer lock ([`PermitInfo::rw`] set), whose key starts
    /// with `prefix` (`""` for all), ordered by key, then the semaphore's
    /// permits before the lock's holders, then slot.
    ///
    /// # Errors
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for a bad prefix; store errors otherwise.
    pub async fn list_permits(&self, prefix: &str) -> Result<Vec<PermitInfo>> {
        let all = self.list_holders(prefix).await?;
        Ok(all.into_iter().filter_map(LeaseInfo::into_permit).collect())
    }

    /// The live grants of `key`'s reader-writer lock when `rw`, else of its
    /// semaphore, by slot: `holders` of [`RwLock`](crate::RwLock) and of
    /// [`Semaphore`].
    pub(crate) async fn slot_holders(&self, key: &Key, rw: bool) -> Result<Vec<PermitInfo>> {
        let all = self.backend().list(key.as_str()).await?;
        Ok(all
            .into_iter()
            .filter_map(LeaseInfo::into_permit)
            .filter(|p| p.key == *key && p.rw.is_some() == rw)
            .collect())
    }
}

impl Semaphore {
    /// The semaphore's key.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// How many permits this handle counts.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// Tries once to take a permit with the default ttl (30 s).
    ///
    /// # Errors
    /// [`Error::Busy`](crate::Error::Busy) if every permit is taken (naming the holder whose
    /// permit expires first); store errors otherwise.
    pub async fn try_acquire(&self) -> Result<LeaseGuard> {
        self.acquire_with(&AcquireOptions::new()).await
    }

    /// Takes a permit, waiting up to `wait` for one to be released.
    ///
    /// # Errors
    /// [`Error::Timeout`](crate::Error::Timeout) if none came within `wait`; otherwise as
    /// [`try_acquire`](Self::try_acquire).
    pub async fn acquire(&self, wait: Duration) -> Result<LeaseGuard> {
        self.acquire_with(&AcquireOptions::new().with_wait(wait))
            .await
    }

    /// Takes a permit as `options` say, with the mutex's rules
    /// ([`Locks::acquire_with`]): waiters of this handle's key queue
    /// locally and the first waits at the store, woken by any permit
    /// release of the key.
    ///
    /// # Errors
    /// As [`Locks::acquire_with`].
    pub async fn acquire_with(&self, options: &AcquireOptions) -> Result<LeaseGuard> {
        let request = AcquireRequest::permit(
            self.key.clone(),
            options.ttl(),
            self.locks.holder_label(),
            self.permits,
        )?;
        self.locks.acquire_permit(request, options).await
    }

    /// The live permits of this semaphore, by slot.
    ///
    /// # Errors
    /// Store errors.
    pub async fn holders(&self) -> Result<Vec<PermitInfo>> {
        self.locks.slot_holders(&self.key, false).await
    }
}
