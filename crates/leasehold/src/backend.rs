//! For writing a store: the [`Backend`] trait (a few atomic operations that
//! every backend implements exactly), the values it exchanges with the core,
//! and the tools the built-in stores share.
//!
//! Applications need little of this module: [`Locks`](crate::Locks) takes
//! any `Backend`, and what its methods return ([`Lease`], [`LeaseInfo`],
//! [`OwnerId`]) is also at the crate root. A store's author needs all of it:
//!
//! - the trait and its values: [`Backend`], [`AcquireRequest`] (with
//!   [`TRY_ONCE_LOCK_WAIT`]), [`Acquire`], [`Busy`], [`Lease`],
//!   [`LeaseInfo`], [`OwnerId`], [`BoxFuture`];
//! - waking waiters: a [`Subscription`] per waiter, fed by one [`WakeHub`];
//! - values in the forms stores keep: [`duration_to_millis`],
//!   [`millis_to_duration`], [`token_to_i64`], [`token_from_i64`];
//! - reading a record back: [`RecordDecoder`] checks every field and
//!   reports a damaged record alike on every store ([`CorruptRecord`]);
//! - errors: [`Error::unavailable`](crate::Error::unavailable),
//!   [`Error::backend`](crate::Error::backend) and
//!   [`Error::in_store`](crate::Error::in_store) (see the trait's
//!   `# Contract`).
//!
//! The conformance suite (module `conformance`, feature `conformance`)
//! checks a store against the contract.

mod record;

pub use crate::notify::{Subscription, WakeHub};
pub use crate::rwlock::{RwSide, WRITER_MARK_MAX, WRITER_SLOT};
pub use crate::semaphore::{PermitInfo, MAX_PERMITS};
pub use record::{
    duration_to_millis, millis_to_duration, token_from_i64, token_to_i64, CorruptRecord,
    RecordDecoder,
};

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::Result;
use crate::key::Key;
use crate::time::validate_ttl;

/// A boxed, sendable future: what every [`Backend`] method returns, so the
/// trait stays object-safe and a store can be chosen from a URL at run time.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A lock store.
///
/// # Contract
///
/// Every backend implements the lease protocol exactly; the shared
/// conformance suite (feature `conformance`) checks it.
///
/// - **One atomic operation per method.** `try_acquire`, `renew`, `release`
///   and `force_release` are each a single statement, script or command (or
///   one transaction) at the store. Never read-then-write from the client.
/// - **The store's clock decides expiry**, inside that atomic operation. The
///   caller's wall clock never does.
/// - **Fencing tokens never go backwards** for a key: every grant returns a
///   token larger than any earlier grant of that key, across release,
///   expiry, force-release and store restarts. The counter lives in a record
///   that is never deleted.
/// - **Owner checks.** `renew` and `release` act only if both owner and
///   token match; `renew` never resurrects an expired lease, even one nobody
///   took since.
/// - **A repeated request is the same grant, extended.** The core repeats
///   a request (same [`AcquireRequest`], same [`OwnerId`]) after a grant
///   that arrived too late, and a driver re-sends a command whose answer
///   was lost. A repeat while that owner's grant of the same kind (and
///   side) is live answers that grant again (same token, same slot) with
///   its expiry counted from the repeat at the store's clock, as a renewal
///   would; it never takes a second slot, is never busy to that owner, and
///   never answers "granted" for an expiry the store did not extend. An
///   expired grant is not brought back: the repeat follows the ordinary
///   rules (busy, or a new grant with a new token).
/// - **Inputs are already valid.** Keys are [`Key`]s and ttls are within
///   bounds; a backend does no validation of its own and never builds a
///   query by pasting a key into its text.
/// - **Errors are classified:** transient failures (connection refused,
///   timeouts, lock contention inside the store) become
///   [`Error::Unavailable`](crate::Error::Unavailable); everything else
///   [`Error::Backend`](crate::Error::Backend); both name the store
///   ([`Error::in_store`](crate::Error::in_store)). A record read back is
///   checked with a [`RecordDecoder`], so a damaged one is reported alike
///   on every store.
///   A backend never panics on a store failure.
/// - **Waking is optional but preferred.** `subscribe` returns a
///   [`Subscription`] that fires after a release of the key (and after an
///   `announce` of it); a backend that cannot notify returns
///   [`Subscription::never`] and waiters fall back to polling.
pub trait Backend: fmt::Debug + Send + Sync + 'static {
    /// Grants the lease iff no live holder exists.
    fn try_acquire<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Acquire>>;

    /// Extends the lease to `ttl` from now (store clock) iff owner and token
    /// match and it has not expired. `Ok(false)` means the lease is gone.
    fn renew<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> BoxFuture<'a, Result<bool>>;

    /// Frees the key iff owner and token match; keeps the fence counter and
    /// wakes waiters. Releasing a lease that is already gone is not an error.
    fn release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<()>>;

    /// The live holder of `key`, if any.
    fn inspect<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<LeaseInfo>>>;

    /// Live holders of every key starting with `prefix` (already validated),
    /// ordered by key.
    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<LeaseInfo>>>;

    /// Admin break: frees the key whoever holds it and bumps its fence, so
    /// the evicted holder's token is stale everywhere. Returns whether a live
    /// lease was broken.
    fn force_release<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool>>;

    /// Starts listening for releases of `key`. The subscription must be in
    /// place when this resolves, so a release that happens after it resolves
    /// is never missed.
    fn subscribe<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Subscription>>;

    /// Wakes every process's subscribers of `key` (see
    /// [`subscribe`](Self::subscribe)) because it was just *granted*, on the
    /// channel release notifications use: how observers of an election learn
    /// of a new leader without polling. Sent by the core after a grant that
    /// others watch; it changes nothing at the store's lease. Returns whether
    /// the store could announce. Default: `Ok(false)`, and observers fall
    /// back to polling (at the leader's expiry while there is one, with a
    /// backoff while there is none).
    fn announce<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool>> {
        let _ = key;
        Box::pin(async { Ok(false) })
    }

    /// Grants one permit of the semaphore `req.key()` iff fewer than
    /// `req.permits()` permits of that key are live at the store's clock
    /// (the request always names permits here; the core checked them).
    ///
    /// Semaphores live apart from mutexes: a semaphore and a mutex of the
    /// same key do not exclude each other. The grant takes the lowest slot
    /// `0..permits` that has no live holder (one exists whenever fewer than
    /// `permits` are live) and a token from the key's permit fence: larger
    /// than every earlier permit grant of the key, whatever its slot, so
    /// each slot's tokens increase too. The lease returned says both
    /// ([`AcquireRequest::granted_permit`]). One atomic operation, like
    /// `try_acquire`; a busy answer names the live holder that expires
    /// first. See docs/semaphore.md.
    ///
    /// A request of kind [`PermitKind::Read`] or [`PermitKind::Write`] is
    /// one attempt at the reader-writer lock `req.key()` instead, kept
    /// apart from the semaphore and the mutex of that key, in the same one
    /// atomic operation (docs/rw-lock.md): a reader is granted the lowest
    /// free slot below [`MAX_PERMITS`] unless the writer
    /// ([`WRITER_SLOT`]) is live or another owner's live writer's marker
    /// stands; a writer is granted [`WRITER_SLOT`] only while nothing is
    /// live and no other owner's marker stands, and then clears the
    /// marker; a writer that finds only readers (and no other owner's
    /// marker) sets or refreshes its own marker for
    /// [`AcquireRequest::writer_mark_ttl`] (none if that is `None`) and
    /// answers busy. Every grant takes the next value of the lock's own
    /// fence; busy names the live holder or other owner's marker that
    /// expires first.
    fn try_acquire_permit<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Acquire>>;

    /// `renew` for a permit: extends it iff key, slot, owner and token
    /// match and it has not expired.
    fn renew_permit<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> BoxFuture<'a, Result<bool>>;

    /// `release` for a permit: frees its slot iff owner and token match,
    /// and wakes the key's subscribers (the same [`Backend::subscribe`]
    /// channel as the mutex of that key; a spurious wake costs one attempt).
    fn release_permit<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<()>>;

    /// Live permits of every semaphore, and live readers and writers of
    /// every reader-writer lock ([`PermitInfo::rw`] set), whose key starts
    /// with `prefix` (already validated), ordered by key, then the
    /// semaphore's permits before the lock's holders, then slot. A
    /// `renew_permit` or `release_permit` of a lease with
    /// [`Lease::rw_side`] acts on the reader-writer lock's records.
    fn list_permits<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<PermitInfo>>>;

    /// Closes the store's connections and stops its background tasks, so
    /// that none is torn down mid-request when the runtime ends. Operations
    /// afterwards fail with an error (never a panic). Default: nothing to do.
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// Who asks for a lease: 128 random bits, fresh for every acquisition.
///
/// Renew and release must present it, so nobody else can release your lock.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerId(u128);

impl OwnerId {
    /// A fresh random owner id.
    pub fn random() -> Self {
        OwnerId(rand::random())
    }

    /// The id as a number.
    pub fn as_u128(self) -> u128 {
        self.0
    }

    /// Rebuilds an id from its 32-digit lowercase hex form, as stored.
    pub fn from_hex(hex: &str) -> Option<Self> {
        (hex.len() == 32)
            .then(|| u128::from_str_radix(hex, 16).ok())
            .flatten()
            .map(OwnerId)
    }
}

impl From<u128> for OwnerId {
    fn from(value: u128) -> Self {
        OwnerId(value)
    }
}

impl fmt::Display for OwnerId {
    /// 32 lowercase hex digits: the form stores keep.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerId({self})")
    }
}

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
}

/// What a permit request asks for ([`Backend::try_acquire_permit`]): one
/// permit of a counting semaphore, or one side of a reader-writer lock.
///
/// A reader-writer lock lives apart from the semaphore and the mutex of
/// the same key. Its readers are permits in slots `0..MAX_PERMITS`, its
/// writer the reserved slot [`WRITER_SLOT`], all from one fence; see
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
        })
    }

    /// A request for one permit of the semaphore `key` of `permits`
    /// permits ([`Backend::try_acquire_permit`]).
    ///
    /// # Errors
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for a bad ttl,
    /// or `permits` outside 1 ..= [`MAX_PERMITS`].
    pub fn permit(key: Key, ttl: Duration, holder: &str, permits: u32) -> Result<Self> {
        let permits = crate::semaphore::validate_permits(permits)?;
        let mut request = Self::new(key, ttl, holder)?;
        request.permit = Some(PermitKind::Semaphore(permits));
        Ok(request)
    }

    /// A request for one side of the reader-writer lock `key`
    /// ([`Backend::try_acquire_permit`] with [`PermitKind::Read`] or
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
    /// gives up on such a lock reports the key [`Acquire::Busy`].
    pub fn lock_wait(&self) -> Duration {
        self.lock_deadline
            .map_or(Duration::ZERO, |d| {
                d.saturating_duration_since(Instant::now())
            })
            .max(TRY_ONCE_LOCK_WAIT)
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
    /// `token` (see [`Backend::try_acquire_permit`]).
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

/// A granted lease, as the store knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    key: Key,
    owner: OwnerId,
    token: u64,
    ttl: Duration,
    /// A semaphore permit's slot; `None` for a mutex lease.
    slot: Option<u32>,
    /// For a reader-writer lock's grant, its side.
    rw: Option<RwSide>,
}

impl Lease {
    /// For a semaphore permit, its slot (`0..permits`); `None` for a mutex.
    pub fn slot(&self) -> Option<u32> {
        self.slot
    }
    /// For a reader-writer lock's grant, its side (a reader's slot is
    /// `0..MAX_PERMITS`, the writer's [`WRITER_SLOT`]); `None` otherwise.
    pub fn rw_side(&self) -> Option<RwSide> {
        self.rw
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
    /// The ttl the lease was granted with.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }
}

/// The outcome of one acquisition attempt.
#[derive(Debug, Clone)]
pub enum Acquire {
    /// The lease is ours.
    Granted(Lease),
    /// Somebody else holds it.
    Busy(Busy),
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

/// What [`Backend::inspect`] and [`Backend::list`] report of a live lease.
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
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A backend that records every call and answers like an empty store.
    #[derive(Debug, Default)]
    struct Recording(std::sync::Mutex<Vec<&'static str>>);

    impl Recording {
        fn called(&self, op: &'static str) {
            self.0.lock().unwrap().push(op);
        }
    }

    impl Backend for std::sync::Arc<Recording> {
        fn try_acquire<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Acquire>> {
            self.called("try_acquire");
            Box::pin(async move { Ok(Acquire::Granted(req.granted(1))) })
        }
        fn renew<'a>(&'a self, _: &'a Lease, _: Duration) -> BoxFuture<'a, Result<bool>> {
            self.called("renew");
            Box::pin(async { Ok(true) })
        }
        fn release<'a>(&'a self, _: &'a Lease) -> BoxFuture<'a, Result<()>> {
            self.called("release");
            Box::pin(async { Ok(()) })
        }
        fn inspect<'a>(&'a self, _: &'a Key) -> BoxFuture<'a, Result<Option<LeaseInfo>>> {
            self.called("inspect");
            Box::pin(async { Ok(None) })
        }
        fn list<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Vec<LeaseInfo>>> {
            self.called("list");
            Box::pin(async { Ok(Vec::new()) })
        }
        fn force_release<'a>(&'a self, _: &'a Key) -> BoxFuture<'a, Result<bool>> {
            self.called("force_release");
            Box::pin(async { Ok(false) })
        }
        fn subscribe<'a>(&'a self, _: &'a Key) -> BoxFuture<'a, Result<Subscription>> {
            self.called("subscribe");
            Box::pin(async { Ok(Subscription::never()) })
        }
        fn try_acquire_permit<'a>(
            &'a self,
            req: &'a AcquireRequest,
        ) -> BoxFuture<'a, Result<Acquire>> {
            self.called("try_acquire_permit");
            Box::pin(async move { Ok(Acquire::Granted(req.granted_permit(0, 1))) })
        }
        fn renew_permit<'a>(&'a self, _: &'a Lease, _: Duration) -> BoxFuture<'a, Result<bool>> {
            self.called("renew_permit");
            Box::pin(async { Ok(true) })
        }
        fn release_permit<'a>(&'a self, _: &'a Lease) -> BoxFuture<'a, Result<()>> {
            self.called("release_permit");
            Box::pin(async { Ok(()) })
        }
        fn list_permits<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Vec<PermitInfo>>> {
            self.called("list_permits");
            Box::pin(async { Ok(Vec::new()) })
        }
    }

    /// Backends do no validation of their own (the contract): the core
    /// rejects a bad ttl, key or list prefix before any backend call, and
    /// a lease (whose ttl renewals reuse) exists only with a checked ttl.
    #[tokio::test]
    async fn locks_validate_before_reaching_the_backend() {
        use crate::error::Error;
        use crate::lock::{AcquireOptions, Locks};

        let recording = std::sync::Arc::new(Recording::default());
        let locks = Locks::new(recording.clone());
        for ttl in [
            Duration::ZERO,
            Duration::from_millis(99),
            Duration::from_secs(86_401),
        ] {
            let options = AcquireOptions::new().with_ttl(ttl);
            let refused = locks.acquire_with("k", &options).await;
            assert!(matches!(
                refused,
                Err(Error::InvalidInput { what: "ttl", .. })
            ));
        }
        for prefix in ["x\u{7}", &"p".repeat(257)] {
            let refused = locks.list(prefix).await;
            assert!(matches!(
                refused,
                Err(Error::InvalidInput { what: "prefix", .. })
            ));
        }
        for bad in ["", "a\nb"] {
            assert!(locks.inspect(bad).await.is_err());
            assert!(locks.force_release(bad).await.is_err());
            assert!(locks.try_acquire(bad).await.is_err());
        }
        for permits in [0, crate::MAX_PERMITS + 1] {
            assert!(locks.semaphore("k", permits).is_err());
        }
        assert!(locks.semaphore("", 3).is_err());
        let sem = locks.semaphore("k", 3).unwrap();
        let bad_ttl = AcquireOptions::new().with_ttl(Duration::ZERO);
        assert!(sem.acquire_with(&bad_ttl).await.is_err());
        assert!(locks.list_permits("x\u{7}").await.is_err());
        assert!(locks.rw_lock("").is_err());
        let rw = locks.rw_lock("k").unwrap();
        assert!(rw.read_with(&bad_ttl).await.is_err());
        assert!(rw.write_with(&bad_ttl).await.is_err());
        assert_eq!(*recording.0.lock().unwrap(), Vec::<&str>::new());
        // Both sides of a reader-writer lock go to the permit operations,
        // and their leases say which side they hold.
        for side in [crate::RwSide::Read, crate::RwSide::Write] {
            let guard = match side {
                crate::RwSide::Read => rw.try_read().await.unwrap(),
                crate::RwSide::Write => rw.try_write().await.unwrap(),
            };
            assert_eq!(guard.rw_side(), Some(side));
            guard.release().await.unwrap();
        }
        assert_eq!(
            std::mem::take(&mut *recording.0.lock().unwrap()),
            [
                "try_acquire_permit",
                "release_permit",
                "try_acquire_permit",
                "release_permit"
            ]
        );
        // A permit goes to the permit operations, a mutex to the mutex's.
        let permit = sem.try_acquire().await.unwrap();
        assert_eq!(permit.slot(), Some(0));
        permit.release().await.unwrap();
        assert_eq!(
            std::mem::take(&mut *recording.0.lock().unwrap()),
            ["try_acquire_permit", "release_permit"]
        );
        // The same calls with good input do reach it.
        locks.list("x").await.unwrap();
        let guard = locks.try_acquire("k").await.unwrap();
        assert_eq!(guard.lease().ttl(), crate::time::DEFAULT_TTL);
        guard.release().await.unwrap();
        assert_eq!(
            *recording.0.lock().unwrap(),
            ["list", "try_acquire", "release"]
        );
    }
}
