//! Reader-writer locks with a lease per grant: [`RwLock`], made by
//! [`Locks::rw_lock`].
//!
//! A grant is a permit of the key's reader-writer record and goes through
//! the semaphore's engine: the acquisition loop of [`Locks`] and
//! [`LeaseGuard`] (renewal, `lost()`, release). The store branches once on
//! the request's [`PermitKind`](crate::backend::PermitKind) inside
//! [`Backend::try_acquire_permit`](crate::backend::Backend::try_acquire_permit):
//! readers are permits in slots `0..MAX_PERMITS`, the writer is the reserved
//! slot [`WRITER_SLOT`](crate::backend::WRITER_SLOT), granted only when no reader is live, and every
//! grant takes its token from the one fence of the key. A writer that finds
//! readers while it waits leaves a marker (its owner, living at most
//! [`WRITER_MARK_MAX`](crate::backend::WRITER_MARK_MAX) past its last attempt) that turns new readers
//! away, so a stream of readers cannot starve it.
//! The rules are in docs/rw-lock.md.

use std::time::Duration;

use crate::backend::{AcquireRequest, PermitInfo, RwSide};
use crate::error::Result;
use crate::guard::LeaseGuard;
use crate::key::Key;
use crate::lock::{AcquireOptions, Locks};

/// A reader-writer lock: shared readers or one writer on `key`, each grant
/// with its own lease and fencing token, and a waiting writer is not
/// starved by readers. Cheap to clone.
///
/// ```
/// use leasehold::{backends::memory::MemoryBackend, Locks};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
///
/// let locks = Locks::new(MemoryBackend::new());
/// let table = locks.rw_lock("tables:users")?;
/// let r1 = table.try_read().await?;
/// let r2 = table.try_read().await?;
/// assert!(table.try_write().await.is_err(), "readers exclude the writer");
/// r1.release().await?;
/// let last_reader = r2.token();
/// r2.release().await?;
/// let w = table.try_write().await?;
/// assert!(w.token() > last_reader, "a writer's token is above every earlier grant");
/// assert!(table.try_read().await.is_err(), "the writer excludes readers");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RwLock {
    locks: Locks,
    key: Key,
}

impl Locks {
    /// The reader-writer lock `key`. It lives apart from the mutex and the
    /// semaphore of the same key: neither excludes it.
    ///
    /// # Errors
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) (no I/O) for a
    /// bad key.
    pub fn rw_lock(&self, key: &str) -> Result<RwLock> {
        Ok(RwLock {
            key: Key::new(key)?,
            locks: self.clone(),
        })
    }
}

impl RwLock {
    /// The lock's key.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// Tries once to take a shared (reader) grant with the default ttl.
    ///
    /// # Errors
    /// [`Error::Busy`](crate::Error::Busy) if a writer holds the lock or
    /// waits for it (naming the holder that expires first); store errors
    /// otherwise.
    ///
    /// # Cancel safety
    /// As [`Locks::try_acquire`].
    pub async fn try_read(&self) -> Result<LeaseGuard> {
        self.read_with(&AcquireOptions::new()).await
    }

    /// Takes a shared grant, waiting up to `wait`.
    ///
    /// # Errors
    /// [`Error::Timeout`](crate::Error::Timeout) if none came within
    /// `wait`; otherwise as [`try_read`](Self::try_read).
    ///
    /// # Cancel safety
    /// As [`Locks::try_acquire`].
    pub async fn read(&self, wait: Duration) -> Result<LeaseGuard> {
        self.read_with(&AcquireOptions::new().with_wait(wait)).await
    }

    /// Takes a shared grant as `options` say ([`Locks::acquire_with`]'s
    /// rules).
    ///
    /// # Errors
    /// As [`Locks::acquire_with`].
    ///
    /// # Cancel safety
    /// As [`Locks::try_acquire`].
    pub async fn read_with(&self, options: &AcquireOptions) -> Result<LeaseGuard> {
        self.take(RwSide::Read, options).await
    }

    /// Tries once to take the exclusive (writer) grant with the default
    /// ttl. Trying once, it leaves no marker: readers keep coming.
    ///
    /// # Errors
    /// [`Error::Busy`](crate::Error::Busy) if readers, a writer, or another
    /// waiting writer are there; store errors otherwise.
    ///
    /// # Cancel safety
    /// As [`Locks::try_acquire`].
    pub async fn try_write(&self) -> Result<LeaseGuard> {
        self.write_with(&AcquireOptions::new()).await
    }

    /// Takes the exclusive grant, waiting up to `wait`. New readers are
    /// turned away while it waits, so it gets the lock once the readers
    /// present when it started have let go.
    ///
    /// # Errors
    /// [`Error::Timeout`](crate::Error::Timeout) if not granted within
    /// `wait`; otherwise as [`try_write`](Self::try_write).
    ///
    /// # Cancel safety
    /// As [`Locks::try_acquire`].
    pub async fn write(&self, wait: Duration) -> Result<LeaseGuard> {
        self.write_with(&AcquireOptions::new().with_wait(wait))
            .await
    }

    /// Takes the exclusive grant as `options` say ([`Locks::acquire_with`]'s
    /// rules).
    ///
    /// # Errors
    /// As [`Locks::acquire_with`].
    ///
    /// # Cancel safety
    /// As [`Locks::try_acquire`].
    pub async fn write_with(&self, options: &AcquireOptions) -> Result<LeaseGuard> {
        self.take(RwSide::Write, options).await
    }

    async fn take(&self, side: RwSide, options: &AcquireOptions) -> Result<LeaseGuard> {
        // One request for the whole wait: its owner is the marker's owner,
        // so a waiting writer's later attempts are recognised as its own.
        let request = AcquireRequest::rw(
            self.key.clone(),
            options.ttl(),
            self.locks.holder_label(),
            side,
        )?;
        self.locks.acquire_permit(request, options).await
    }

    /// The live readers and writer of this lock, by slot (the writer's is
    /// [`WRITER_SLOT`](crate::backend::WRITER_SLOT)); each has `rw` set.
    ///
    /// # Errors
    /// Store errors.
    pub async fn holders(&self) -> Result<Vec<PermitInfo>> {
        self.locks.slot_holders(&self.key, true).await
    }
}
