//! What a store answers: a granted lease, a busy key, a listed lease, and
//! the time a renewal attempt may take.

use std::time::Duration;

use super::{KeyKind, OwnerId, PermitInfo, RwSide};
use crate::key::Key;

/// A granted lease, as the store knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub(super) key: Key,
    pub(super) owner: OwnerId,
    pub(super) token: u64,
    pub(super) ttl: Duration,
    /// A semaphore permit's slot; `None` for a mutex lease.
    pub(super) slot: Option<u32>,
    /// For a reader-writer lock's grant, its side.
    pub(super) rw: Option<RwSide>,
}

impl Lease {
    /// For a semaphore permit, its slot (`0..permits`); `None` for a mutex.
    pub fn slot(&self) -> Option<u32> {
        self.slot
    }
    /// For a reader-writer lock's grant, its side (a reader's slot is
    /// `0..MAX_PERMITS`, the writer's [`WRITER_SLOT`](super::WRITER_SLOT)); `None` otherwise.
    pub fn rw_side(&self) -> Option<RwSide> {
        self.rw
    }
    /// The kind of lock this lease holds the key as (the twin of
    /// [`AcquireRequest::key_kind`](super::AcquireRequest::key_kind)).
    pub fn key_kind(&self) -> KeyKind {
        match (self.slot, self.rw) {
            (None, _) => KeyKind::Mutex,
            (Some(_), Some(_)) => KeyKind::ReaderWriter,
            (Some(_), None) => KeyKind::Semaphore,
        }
    }
    /// The locked key.
    pub fn key(&self) -> &Key {
        &self.key
    }
    /// The owner id that renew and release must present.
    pub fn owner(&self) -> OwnerId {
        self.owner
    }
    /// The fencing token: larger than every earlier grant of this key.
    pub fn token(&self) -> u64 {
        self.token
    }
    /// The ttl the lease was granted with: the one asked for, or the
    /// longer one the store enforces (see [`enforced_for`](Self::enforced_for)).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// This lease with the ttl the store actually enforces, for a store
    /// that can only keep coarser ttls than asked and rounds them **up**
    /// (etcd: whole seconds, a server minimum), or whose grant rides on an
    /// expiry that started before the request (etcd: a lease granted
    /// ahead, its age taken off). The guard's deadline and
    /// renewals follow [`ttl`](Self::ttl), so a holder never believes it
    /// holds longer than the store keeps the lease. A store must never
    /// report a ttl longer than it keeps the lease from the request's
    /// sending.
    #[must_use]
    pub fn enforced_for(mut self, ttl: Duration) -> Lease {
        self.ttl = ttl;
        self
    }
}

/// The outcome of one acquisition attempt.
#[derive(Debug, Clone)]
pub enum Acquire {
    /// The lease is ours.
    Granted(Lease),
    /// Somebody else holds it.
    Busy(Busy),
    /// The key is a lock of another kind (its anchor record says so), and
    /// nothing was changed at the store. The core turns a mutex request
    /// on a reader-writer lock's key into that lock's writer, and every
    /// other mismatch into [`Error::KindMismatch`](crate::Error::KindMismatch).
    OtherKind(KeyKind),
}

/// Why an attempt did not get the lease: who holds it and for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Busy {
    /// The current holder's human label.
    pub holder: String,
    /// The longest the current lease can still last, by the store's clock.
    /// Zero if the holder vanished between the attempt and this report.
    pub remaining: Duration,
}

/// What [`Backend::inspect`](super::Backend::inspect) and
/// [`Backend::list`](super::Backend::list) report of a live lease: a
/// mutex's holder, or (in a listing) a semaphore permit or a
/// reader-writer lock's reader or writer, which say so as a [`Lease`]
/// does (`slot`, `rw`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseInfo {
    /// The locked key.
    pub key: Key,
    /// The holder's human label.
    pub holder: String,
    /// The holder's fencing token.
    pub token: u64,
    /// Time left before the lease expires, by the store's clock.
    pub remaining: Duration,
    /// A permit's slot (see [`Lease::slot`]); `None` for a mutex holder.
    pub slot: Option<u32>,
    /// A reader-writer lock's side (see [`Lease::rw_side`]); `None`
    /// otherwise.
    pub rw: Option<RwSide>,
}

impl LeaseInfo {
    /// A mutex's holder.
    pub fn mutex(key: Key, holder: String, token: u64, remaining: Duration) -> LeaseInfo {
        LeaseInfo {
            key,
            holder,
            token,
            remaining,
            slot: None,
            rw: None,
        }
    }

    /// The permit, reader or writer this is, as
    /// [`Locks::list_permits`](crate::Locks::list_permits) reports it;
    /// `None` for a mutex's holder.
    pub fn into_permit(self) -> Option<PermitInfo> {
        Some(PermitInfo {
            slot: self.slot?,
            key: self.key,
            holder: self.holder,
            token: self.token,
            remaining: self.remaining,
            rw: self.rw,
        })
    }
}

impl From<PermitInfo> for LeaseInfo {
    fn from(permit: PermitInfo) -> LeaseInfo {
        LeaseInfo {
            key: permit.key,
            holder: permit.holder,
            token: permit.token,
            remaining: permit.remaining,
            slot: Some(permit.slot),
            rw: permit.rw,
        }
    }
}

/// How long one renewal request may take before the guard gives it up and
/// sends another (on a fresh connection, where the store's pool has one):
/// a sixth of the ttl, so several attempts fit between the first renewal
/// time (ttl/3) and the lease's deadline, but at least 100 ms, so that a
/// short ttl on a slow store still leaves an attempt time for a round trip.
/// A store that bounds its own statements (PostgreSQL's row-lock wait)
/// keeps inside it.
pub(crate) fn renew_attempt_timeout(ttl: Duration) -> Duration {
    (ttl / 6).max(Duration::from_millis(100))
}
