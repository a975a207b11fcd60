//! For writing a store: the [`Backend`] trait (a few atomic operations that
//! every backend implements exactly), the values it exchanges with the core,
//! and the tools the built-in stores share.
//!
//! Applications need little of this module: [`Locks`](crate::Locks) takes
//! any `Backend`, and what its methods return ([`Lease`], [`LeaseInfo`],
//! [`OwnerId`]) is also at the crate root. A store's author needs all of it:
//!
//! - the trait and its values: [`Backend`], [`AcquireRequest`] (with
//!   [`TRY_ONCE_LOCK_WAIT`]), [`Acquire`], [`Busy`], [`KeyKind`], [`Lease`],
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

mod idle;
mod lease;
mod permit;
mod record;
mod request;

pub use crate::kind::KeyKind;
pub use crate::notify::{HandOff, Subscription, WakeHub};
pub use crate::scheme::parse_idle_window;
pub(crate) use idle::check_idle_window;
// For the stores whose sweep pass a caller may start (`sweep_idle`).
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mongodb"))]
pub(crate) use idle::check_sweep_window;
pub use idle::{SweepSchedule, DEFAULT_IDLE_WINDOW};
pub(crate) use lease::renew_attempt_timeout;
pub use lease::{Acquire, Busy, Lease, LeaseInfo};
pub use permit::{
    listing, validate_permits, PermitInfo, RwSide, MAX_PERMITS, WRITER_MARK_MAX, WRITER_SLOT,
};
pub use record::{
    duration_to_millis, millis_to_duration, token_from_i64, token_to_i64, CorruptRecord,
    RecordDecoder,
};
pub use request::{AcquireRequest, OwnerId, PermitKind, QUEUE_ENTRY_TTL, TRY_ONCE_LOCK_WAIT};

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::error::Result;
use crate::key::Key;

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
/// - **One key is one lock.** A key's *anchor* is its mutex record (the
///   record `try_acquire` uses); it also names the key's [`KeyKind`]:
///   absent/NULL is a mutex (every record written before kinds existed),
///   else `rw` or `sem` ([`KeyKind::stored`]). The permit records are
///   apart, but the anchor decides:
///   - `try_acquire` on a key whose kind is not mutex answers
///     [`Acquire::OtherKind`] and changes nothing (the same one statement
///     as the ordinary attempt, one condition more).
///   - `try_acquire` of a permit (semaphore, reader or writer) first
///     *claims* the anchor, in the same atomic
///     operation as the permit attempt where the store allows it (else as
///     a single-record step just before it; the claim is never undone
///     while permits of that kind may be live, so that is still safe):
///     the requested kind already ([`AcquireRequest::key_kind`]): go on;
///     mutex with a live holder: [`Acquire::Busy`] naming that holder;
///     mutex with none: set the requested kind and raise the permits'
///     fence to at least the anchor's fence (the key's tokens keep
///     increasing across the change), then go on; the other non-mutex
///     kind: [`Acquire::OtherKind`], nothing changed. A claimed kind is
///     never changed back.
///   - `force_release` frees the key whatever its kind: the mutex holder,
///     or every permit, reader, writer and waiting writer's marker, and
///     bumps the fence that the key's next grant counts from.
/// - **A queue per key, for a store that says so** ([`queues`](Backend::queues)
///   answers `true`; today memory, SQLite, PostgreSQL, Redis (one server
///   or a Cluster), MongoDB and etcd, mutex requests only). A mutex
///   request that carries a queue entry ([`AcquireRequest::queue_entry_ttl`])
///   and finds the key busy enters the key's queue in the same atomic
///   operation: an entry of its owner, holder label, claim window
///   ([`AcquireRequest::claim_window`]) and ticket
///   ([`AcquireRequest::queue_ticket`]), living `queue_entry_ttl` at the
///   store's clock, after every entry already there; a repeat renews the
///   entry and its ticket and keeps its place. An entry past its lease is
///   dead: skipped and removed. Then:
///   - **a free key goes to the queue's head first.** A mutex attempt (any,
///     queued or not) that finds the key free while the queue has a live
///     head other than its own owner *hands the key over*: it grants the
///     head (the next token, the head's label, an expiry of the head's
///     claim window from now), removes the head's entry, tells the head
///     ([`WakeHub::hand_over`], with the token and the entry's ticket) and
///     answers busy, naming the head; it enters the queue itself if it
///     queues. A free key with no live entry, or whose head is the
///     requester, is granted to it, and its entry removed.
///   - **`release` hands over** in the same atomic operation: a key freed
///     while its queue has a live head is granted to the head as above and
///     only the head is told; other waiters are not woken. With no head,
///     the release wakes the key's subscribers as before.
///   - **The head claims** the grant with a renewal (or a repeat of its
///     request, which the store answers as the same grant, extended); a
///     grant nobody claims lapses at the end of its claim window and the
///     next attempt hands the key to the next head.
///   - [`leave_queue`](Backend::leave_queue) removes an owner's entry, and
///     gives back a grant handed over to that owner if it still holds it
///     (handing the key to the next head).
/// - **Waking is optional but preferred.** `subscribe` returns a
///   [`Subscription`] that fires after a release of the key (and after an
///   `announce` of it); a backend that cannot notify returns
///   [`Subscription::never`] and waiters fall back to polling.
pub trait Backend: fmt::Debug + Send + Sync + 'static {
    /// One attempt at the lock `req.key()`, of the request's kind
    /// ([`AcquireRequest::permit_kind`]): a mutex, a semaphore permit, or
    /// one side of a reader-writer lock. Each store keeps its statement
    /// per kind behind one `match`.
    ///
    /// **A mutex** (no permit kind): grants the lease iff no live holder
    /// exists and the key is a mutex (else [`Acquire::OtherKind`]; see
    /// `# Contract`), with [`AcquireRequest::granted`].
    ///
    /// **A semaphore permit** ([`PermitKind::Semaphore`]): grants one
    /// permit iff fewer than `req.permits()` permits of that key are live
    /// at the store's clock. The key's anchor is claimed first (see
    /// `# Contract`: one key is one lock): a mutex key with a live holder
    /// is busy, a key of the other permit kind answers
    /// [`Acquire::OtherKind`]. The grant takes the lowest slot
    /// `0..permits` that has no live holder (one exists whenever fewer
    /// than `permits` are live) and a token from the key's permit fence:
    /// larger than every earlier permit grant of the key, whatever its
    /// slot, so each slot's tokens increase too. The lease returned says
    /// both ([`AcquireRequest::granted_permit`]); a busy answer names the
    /// live holder that expires first. See docs/semaphore.md.
    ///
    /// **A reader or writer** ([`PermitKind::Read`],
    /// [`PermitKind::Write`]), after the same claim of the anchor as kind
    /// `rw` (docs/rw-lock.md): a reader is granted the lowest free slot
    /// below [`MAX_PERMITS`] unless the writer ([`WRITER_SLOT`]) is live
    /// or another owner's live writer's marker stands; a writer is
    /// granted [`WRITER_SLOT`] only while nothing is live and no other
    /// owner's marker stands, and then clears the marker; a writer that
    /// finds only readers (and no other owner's marker) sets or refreshes
    /// its own marker for [`AcquireRequest::writer_mark_ttl`] (none if
    /// that is `None`) and answers busy. Every grant takes the next value
    /// of the lock's own fence; busy names the live holder or other
    /// owner's marker that expires first.
    ///
    /// Each kind is one atomic operation.
    fn try_acquire<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Acquire>>;

    /// Extends the lease to `ttl` from now (store clock) iff owner and token
    /// (and, for a permit, slot and side: [`Lease::slot`],
    /// [`Lease::rw_side`]) match and it has not expired. `Ok(false)` means
    /// the lease is gone.
    ///
    /// A renewal never moves the expiry earlier: one the store applies late
    /// (held on the way, or dropped by the guard and retried) may arrive
    /// after a later renewal whose deadline the holder already trusts. A
    /// store that computes the expiry at execution on its own clock gets
    /// this for free; one that sends an expiry computed by the client keeps
    /// the later of the two (MongoDB: `$max`).
    fn renew<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> BoxFuture<'a, Result<bool>>;

    /// Frees the key (a permit: its slot) iff owner and token match; keeps
    /// the fence counter and wakes the key's subscribers (a permit's
    /// release wakes the same [`subscribe`](Self::subscribe) channel as
    /// the key's mutex; a spurious wake costs one attempt). Releasing a
    /// lease that is already gone is not an error.
    fn release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<()>>;

    /// The live holder of the mutex `key`, if any (a semaphore's or
    /// reader-writer lock's holders are in [`list`](Self::list)).
    fn inspect<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<LeaseInfo>>>;

    /// Live holders of every key starting with `prefix` (already
    /// validated): mutex holders, semaphore permits, and readers and
    /// writers (their [`LeaseInfo::slot`] and [`LeaseInfo::rw`] say
    /// which), ordered by key, then a mutex's holder, the semaphore's
    /// permits and the lock's holders, then slot: as [`listing`] orders
    /// them.
    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<LeaseInfo>>>;

    /// Admin break: frees the key whoever holds it, whatever its kind (the
    /// mutex holder, or every permit, reader and writer, and a waiting
    /// writer's marker), and bumps its fence, so the evicted holders'
    /// tokens are stale everywhere. Returns whether a live lease or permit
    /// was broken.
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

    /// Whether this store keeps a queue of waiters per key and hands a
    /// freed key to its head (the `# Contract`'s queue rules). The core
    /// then lets every waiter of a mutex queue at the store, first come,
    /// first served across processes; otherwise waiters race for the key
    /// at each release. Default: `false`.
    fn queues(&self) -> bool {
        false
    }

    /// Whether [`release_to`](Self::release_to) can hand a mutex to a
    /// waiter of this process inside the release. The core then lets the
    /// front waiter of a key's local queue (a racing mutex waiter, local.rs)
    /// leave its request with the key's holders. Default: `false`.
    fn hands_over_locally(&self) -> bool {
        false
    }

    /// Releases the mutex `lease` and grants its key to `next` (a mutex
    /// request of a waiter in this process) in the same atomic operation:
    /// one store write where a release and the waiter's grant are two.
    /// `Ok(Some(lease))` is `next`'s grant, as [`try_acquire`](Self::try_acquire)
    /// would have answered it (the key's next token, its expiry counted
    /// from this call at the store's clock); `Ok(None)`: nothing changed
    /// (the lease no longer holds the key, the key has waiters queued at
    /// the store, whose head must get it, or the store cannot do this),
    /// and the caller releases `lease` as usual. Waiters subscribed to the
    /// key are not woken: it is not free. Called only if
    /// [`hands_over_locally`](Self::hands_over_locally), and only with a
    /// mutex lease and a mutex request (the core offers no other kind).
    /// Default: `Ok(None)`.
    fn release_to<'a>(
        &'a self,
        lease: &'a Lease,
        next: &'a AcquireRequest,
    ) -> BoxFuture<'a, Result<Option<Lease>>> {
        let _ = (lease, next);
        Box::pin(async { Ok(None) })
    }

    /// Takes `owner` out of `key`'s queue, and gives back a grant handed
    /// over to `owner` that it still holds (the key then goes to the next
    /// head): for a waiter whose wait ended (timeout, cancel) without
    /// taking a grant. Owner ids are fresh per acquisition, so no lease of
    /// anybody else can match. Default: nothing to do (a store without
    /// queues).
    fn leave_queue<'a>(&'a self, key: &'a Key, owner: OwnerId) -> BoxFuture<'a, Result<()>> {
        let _ = (key, owner);
        Box::pin(async { Ok(()) })
    }

    /// Closes the store's connections and stops its background tasks, so
    /// that none is torn down mid-request when the runtime ends. Operations
    /// afterwards fail with an error (never a panic). Default: nothing to do.
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}
