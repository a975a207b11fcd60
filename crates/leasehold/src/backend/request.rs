//! What a store receives: the validated request for a lease (its key,
//! owner, holder label, ttl, wait bound and kind) and the owner id.

use std::time::Duration;

use tokio::time::Instant;

use super::{validate_permits, KeyKind, Lease, RwSide, WRITER_MARK_MAX};
use crate::error::Result;
use crate::key::Key;
pub use crate::owner::OwnerId;
use crate::time::validate_ttl;

/// A validated request for a lease, as a backend receives it.
#[derive(Debug, Clone)]
pub struct AcquireRequest {
    key: Key,
    owner: OwnerId,
    holder: String,
    ttl: Duration,
    /// The caller's wait bound, if it waits; see [`AcquireRequest::lock_wait`].
    lock_deadline: Option<Instant>,
    /// For a permit: which kind (a semaphore's count, or a side of a
    /// reader-writer lock).
    permit: Option<PermitKind>,
    /// For a waiter in the key's queue: its entry's lease and this
    /// attempt's ticket; see [`AcquireRequest::queue_entry_ttl`].
    queue: Option<QueueEntry>,
}

/// What a queued waiter's attempt asks the store to write into its entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct QueueEntry {
    ttl: Duration,
    ticket: u32,
}

/// What a permit request asks for ([`Backend::try_acquire`](super::Backend::try_acquire)): one
/// permit of a counting semaphore, or one side of a reader-writer lock.
///
/// A reader-writer lock lives apart from the semaphore and the mutex of
/// the same key. Its readers are permits in slots `0..MAX_PERMITS`, its
/// writer the reserved slot [`WRITER_SLOT`](super::WRITER_SLOT), all from one fence; see
/// docs/rw-lock.md for the store's rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermitKind {
    /// A permit of a semaphore of this many permits.
    Semaphore(u32),
    /// A shared (reader) grant of a reader-writer lock.
    Read,
    /// The exclusive (writer) grant of a reader-writer lock.
    Write,
}

impl PermitKind {
    /// The side of a reader-writer lock, `None` for a semaphore.
    pub fn rw_side(self) -> Option<RwSide> {
        match self {
            PermitKind::Semaphore(_) => None,
            PermitKind::Read => Some(RwSide::Read),
            PermitKind::Write => Some(RwSide::Write),
        }
    }
}

/// How long an attempt that does not wait (a try-once acquire) may still
/// queue behind a row or database lock held by another transaction before
/// it reports the key busy: long enough for a concurrent statement on the
/// same key to finish, short enough to answer a try-once call at once.
pub const TRY_ONCE_LOCK_WAIT: Duration = Duration::from_millis(50);

/// How long a waiter's entry in a key's queue lives unless the waiter
/// renews it (each of its attempts does, about every third of this): a
/// waiter that dies, times out or is cancelled leaves the queue within it
/// at the latest. It also bounds the claim window of a grant handed over
/// to a waiter ([`AcquireRequest::claim_window`]).
pub const QUEUE_ENTRY_TTL: Duration = Duration::from_secs(2);

/// Longest holder label, in bytes; longer labels are cut at a char boundary.
const MAX_HOLDER_BYTES: usize = 256;

impl AcquireRequest {
    /// A request with a fresh random owner.
    ///
    /// `holder` is a human label (`host:pid`) stored for inspection only;
    /// control characters are replaced and it is cut to 256 bytes.
    ///
    /// # Errors
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) if `ttl` is
    /// outside 100 ms ..= 24 h.
    pub fn new(key: Key, ttl: Duration, holder: &str) -> Result<Self> {
        Ok(AcquireRequest {
            key,
            owner: OwnerId::random(),
            holder: sanitize_label(holder),
            ttl: validate_ttl(ttl)?,
            lock_deadline: None,
            permit: None,
            queue: None,
        })
    }

    /// A request for one permit of the semaphore `key` of `permits`
    /// permits ([`Backend::try_acquire`](super::Backend::try_acquire)).
    ///
    /// # Errors
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for a bad ttl,
    /// or `permits` outside 1 ..= [`MAX_PERMITS`](super::MAX_PERMITS).
    pub fn permit(key: Key, ttl: Duration, holder: &str, permits: u32) -> Result<Self> {
        let permits = validate_permits(permits)?;
        let mut request = Self::new(key, ttl, holder)?;
        request.permit = Some(PermitKind::Semaphore(permits));
        Ok(request)
    }

    /// A request for one side of the reader-writer lock `key`
    /// ([`Backend::try_acquire`](super::Backend::try_acquire) with [`PermitKind::Read`] or
    /// [`PermitKind::Write`]).
    ///
    /// # Errors
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for a bad ttl.
    pub fn rw(key: Key, ttl: Duration, holder: &str, side: RwSide) -> Result<Self> {
        let mut request = Self::new(key, ttl, holder)?;
        request.permit = Some(match side {
            RwSide::Read => PermitKind::Read,
            RwSide::Write => PermitKind::Write,
        });
        Ok(request)
    }

    /// For a semaphore permit request, how many permits the caller counts
    /// (`None` for a mutex or a reader-writer lock).
    pub fn permits(&self) -> Option<u32> {
        match self.permit {
            Some(PermitKind::Semaphore(n)) => Some(n),
            _ => None,
        }
    }

    /// What a permit request asks for; `None` for a mutex request.
    pub fn permit_kind(&self) -> Option<PermitKind> {
        self.permit
    }

    /// For a reader-writer lock request, its side.
    pub fn rw_side(&self) -> Option<RwSide> {
        self.permit.and_then(PermitKind::rw_side)
    }

    /// The kind of lock this request asks the key to be: what a store
    /// compares with the kind its anchor record names.
    pub fn key_kind(&self) -> KeyKind {
        match self.permit {
            None => KeyKind::Mutex,
            Some(PermitKind::Read | PermitKind::Write) => KeyKind::ReaderWriter,
            Some(PermitKind::Semaphore(_)) => KeyKind::Semaphore,
        }
    }

    /// This mutex request as the writer of the reader-writer lock of the
    /// same key (same owner, holder, ttl and wait bound): the exclusive
    /// acquire of a key that is a reader-writer lock is its writer. A
    /// writer does not queue (yet): the queue entry is dropped.
    pub(crate) fn as_writer(&self) -> Self {
        AcquireRequest {
            permit: Some(PermitKind::Write),
            queue: None,
            ..self.clone()
        }
    }

    /// For a writer of a reader-writer lock that waits: how long the
    /// marker that turns new readers away may live at the store from this
    /// attempt (docs/rw-lock.md): until the caller's wait deadline, and at
    /// most [`WRITER_MARK_MAX`], which outlasts the longest sleep of a
    /// waiter between two attempts. `None` for a writer that does not wait
    /// (it leaves no marker) and for every other request.
    pub fn writer_mark_ttl(&self) -> Option<Duration> {
        if self.permit != Some(PermitKind::Write) {
            return None;
        }
        let left = self
            .lock_deadline?
            .saturating_duration_since(Instant::now());
        (!left.is_zero()).then(|| left.min(WRITER_MARK_MAX))
    }

    /// Bounds the time the store may spend waiting for locks held by other
    /// transactions (a PostgreSQL row lock, SQLite's write lock) to the
    /// caller's wait deadline. The core sets it from the wait bound.
    pub fn with_lock_deadline(mut self, deadline: Instant) -> Self {
        self.lock_deadline = Some(deadline);
        self
    }

    /// How long, from now, the store may wait for a lock that another
    /// transaction holds on this key's record before answering: the time left
    /// to the caller's wait deadline, and never less than
    /// [`TRY_ONCE_LOCK_WAIT`] (a store cannot wait for "nothing", and a zero
    /// lock timeout means "forever" to PostgreSQL and SQLite). A store that
    /// gives up on such a lock reports the key [`Acquire::Busy`](super::Acquire::Busy).
    pub fn lock_wait(&self) -> Duration {
        self.lock_deadline
            .map_or(Duration::ZERO, |d| {
                d.saturating_duration_since(Instant::now())
            })
            .max(TRY_ONCE_LOCK_WAIT)
    }

    /// A waiter's attempt: if it finds the key busy, the store enters
    /// its owner in the key's queue (or renews its entry, keeping its
    /// place) for `entry_ttl` at the store's clock, marked with `ticket`
    /// (the waiter numbers its attempts; a grant handed over to it names
    /// the ticket its entry carried). Only a mutex request queues today.
    pub fn with_queue_entry(mut self, entry_ttl: Duration, ticket: u32) -> Self {
        self.queue = Some(QueueEntry {
            ttl: entry_ttl,
            ticket,
        });
        self
    }

    /// The lease of this waiter's queue entry, if it queues (see
    /// [`with_queue_entry`](Self::with_queue_entry) and the `# Contract`
    /// of [`Backend`](super::Backend)).
    pub fn queue_entry_ttl(&self) -> Option<Duration> {
        self.queue.map(|q| q.ttl)
    }

    /// The ticket of this attempt, if it queues: stored in the entry and
    /// sent back with a grant handed over to it.
    pub fn queue_ticket(&self) -> Option<u32> {
        self.queue.map(|q| q.ticket)
    }

    /// How long a grant handed over to this waiter lasts at the store
    /// unless the waiter claims it (a renewal, or a repeat of its request):
    /// its queue entry's lease, but never longer than its ttl. A waiter
    /// that died after its last attempt holds the key up this long at most.
    pub fn claim_window(&self) -> Duration {
        self.queue.map_or(self.ttl, |q| q.ttl.min(self.ttl))
    }

    /// Reuses `owner` instead of the fresh random one: for retrying an
    /// attempt whose outcome is unknown, and for tests that forge leases.
    pub fn with_owner(mut self, owner: OwnerId) -> Self {
        self.owner = owner;
        self
    }

    /// The key asked for.
    pub fn key(&self) -> &Key {
        &self.key
    }
    /// The owner id this request will hold the lease under.
    pub fn owner(&self) -> OwnerId {
        self.owner
    }
    /// The human label stored beside the owner.
    pub fn holder(&self) -> &str {
        &self.holder
    }
    /// The lease length asked for.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The lease a store grants for this request with fencing token `token`.
    pub fn granted(&self, token: u64) -> Lease {
        Lease {
            key: self.key.clone(),
            owner: self.owner,
            token,
            ttl: self.ttl,
            slot: None,
            rw: None,
        }
    }

    /// The permit a store grants for this request in `slot` with token
    /// `token` (see [`Backend::try_acquire`](super::Backend::try_acquire)).
    pub fn granted_permit(&self, slot: u32, token: u64) -> Lease {
        Lease {
            slot: Some(slot),
            rw: self.rw_side(),
            ..self.granted(token)
        }
    }
}

fn sanitize_label(label: &str) -> String {
    let mut out: String = label
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    if out.len() > MAX_HOLDER_BYTES {
        let mut end = MAX_HOLDER_BYTES;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_request_names_the_kind_of_key_it_asks_for() {
        let key = Key::new("k").unwrap();
        let ttl = Duration::from_secs(30);
        // The request's kind, and its grant's the same.
        let kind = |req: AcquireRequest| {
            let lease = match req.permit_kind() {
                None => req.granted(1),
                Some(_) => req.granted_permit(0, 1),
            };
            assert_eq!(lease.key_kind(), req.key_kind());
            req.key_kind()
        };
        assert_eq!(
            kind(AcquireRequest::new(key.clone(), ttl, "h").unwrap()),
            KeyKind::Mutex
        );
        for side in [RwSide::Read, RwSide::Write] {
            let req = AcquireRequest::rw(key.clone(), ttl, "h", side).unwrap();
            assert_eq!(kind(req), KeyKind::ReaderWriter);
        }
        let permit = AcquireRequest::permit(key, ttl, "h", 3).unwrap();
        assert_eq!(kind(permit), KeyKind::Semaphore);
    }

    #[test]
    fn a_writer_marks_only_while_it_waits_and_never_past_its_deadline() {
        let key = Key::new("k").unwrap();
        let ttl = Duration::from_secs(30);
        let writer = AcquireRequest::rw(key.clone(), ttl, "h", RwSide::Write).unwrap();
        assert_eq!(
            writer.writer_mark_ttl(),
            None,
            "a try-once writer leaves no mark"
        );
        let far = writer.clone().with_lock_deadline(Instant::now() + ttl * 2);
        assert_eq!(far.writer_mark_ttl(), Some(WRITER_MARK_MAX));
        let near = writer
            .clone()
            .with_lock_deadline(Instant::now() + Duration::from_secs(1));
        let life = near.writer_mark_ttl().unwrap();
        assert!(life > Duration::ZERO && life <= Duration::from_secs(1));
        let past = writer.with_lock_deadline(Instant::now() - Duration::from_millis(1));
        assert_eq!(past.writer_mark_ttl(), None);
        let reader = AcquireRequest::rw(key, ttl, "h", RwSide::Read)
            .unwrap()
            .with_lock_deadline(Instant::now() + ttl);
        assert_eq!(reader.writer_mark_ttl(), None);
        assert_eq!(reader.permits(), None);
        assert_eq!(reader.granted_permit(3, 9).rw_side(), Some(RwSide::Read));
    }

    #[test]
    fn owner_hex_round_trip() {
        let o = OwnerId::random();
        assert_eq!(OwnerId::from_hex(&o.to_string()), Some(o));
        assert_eq!(OwnerId::from_hex("xyz"), None);
        assert_ne!(OwnerId::random(), OwnerId::random());
    }

    #[test]
    fn labels_are_sanitized() {
        assert_eq!(sanitize_label("host:1\n"), "host:1?");
        assert_eq!(sanitize_label(&"é".repeat(200)).len(), 256);
    }

    #[test]
    fn request_rejects_bad_ttl() {
        let k = Key::new("k").unwrap();
        assert!(AcquireRequest::new(k.clone(), Duration::from_millis(5), "h").is_err());
        let r = AcquireRequest::new(k, Duration::from_secs(1), "h").unwrap();
        assert_eq!(r.granted(7).token(), 7);
    }
}
