//! The values of semaphore permits and reader-writer grants that cross the
//! store contract: slot numbering, the permit count's bounds, a listed
//! permit, and the one order of a store's permit listing. They live here,
//! below the stores, so a store needs only the contract, not the primitives
//! built on it (`semaphore.rs`, `rwlock.rs`).

use std::time::Duration;

use crate::error::{Error, Result};
use crate::key::Key;

use super::LeaseInfo;

/// The most permits a semaphore may have: a store scans a key's live
/// permits on every attempt, so the count stays small enough to scan.
pub const MAX_PERMITS: u32 = 1024;

/// Checks a permit count: 1 ..= [`MAX_PERMITS`] (as
/// [`Locks::semaphore`](crate::Locks::semaphore) does, for callers that check input before
/// opening a store).
///
/// # Errors
/// [`Error::InvalidInput`] naming `permits`.
pub fn validate_permits(permits: u32) -> Result<u32> {
    if (1..=MAX_PERMITS).contains(&permits) {
        Ok(permits)
    } else {
        Err(Error::invalid(
            "permits",
            format!("must be 1 ..= {MAX_PERMITS}, got {permits}"),
        ))
    }
}

/// A live permit, reader or writer, as
/// [`Locks::list_permits`](crate::Locks::list_permits) reports it (a store's
/// [`Backend::list`](super::Backend::list) reports it as a [`LeaseInfo`]
/// with its slot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermitInfo {
    /// The semaphore's key.
    pub key: Key,
    /// The permit's slot, `0..permits` of the grant that took it.
    pub slot: u32,
    /// The holder's human label.
    pub holder: String,
    /// The permit's fencing token (see docs/semaphore.md).
    pub token: u64,
    /// Time left before the permit expires, by the store's clock.
    pub remaining: Duration,
    /// For a holder of a reader-writer lock, its side (a reader's slot is
    /// `0..MAX_PERMITS`, the writer's [`WRITER_SLOT`]);
    /// `None` for a semaphore permit.
    pub rw: Option<RwSide>,
}

/// The slot a reader-writer lock's writer holds: just past the readers'
/// `0..MAX_PERMITS`, so the two never meet.
pub const WRITER_SLOT: u32 = MAX_PERMITS;

/// The longest life of a waiting writer's marker at the store, from the
/// attempt that set or refreshed it (never past the writer's wait
/// deadline). A waiter sleeps at most 2 s between attempts (its backoff
/// cap) plus a round trip, and each attempt refreshes the marker, so it
/// does not lapse under a writer that still waits; a writer that gives up
/// (cancelled, crashed) turns new readers away for at most this long.
pub const WRITER_MARK_MAX: Duration = Duration::from_secs(5);

/// One side of a reader-writer lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RwSide {
    /// Shared: any number of readers at once, no writer.
    Read,
    /// Exclusive: one writer, no readers.
    Write,
}

/// A store's listing as [`Backend::list`](super::Backend::list) reports
/// it: its mutex holders, semaphore permits and reader-writer holders
/// (each store keeps them apart and lists each), ordered by key, then a
/// mutex's holder, the semaphore's permits and the lock's holders, then
/// slot. The one order rule every store's listing follows.
pub fn listing(
    mutexes: Vec<LeaseInfo>,
    permits: impl IntoIterator<Item = PermitInfo>,
) -> Vec<LeaseInfo> {
    let mut all = mutexes;
    all.extend(permits.into_iter().map(LeaseInfo::from));
    all.sort_by(|a, b| {
        (&a.key, a.slot.is_some(), a.rw.is_some(), a.slot).cmp(&(
            &b.key,
            b.slot.is_some(),
            b.rw.is_some(),
            b.slot,
        ))
    });
    all
}
