//! [`Locks`], the client handle: the store, the handle's queues and
//! renewals, and the calls a user makes. The acquisition engine every
//! store and primitive shares (waiting with wake-ups, backoff, deadlines,
//! attempts that finish after their caller went away) is in `acquire.rs`;
//! the options of one acquisition in `options.rs`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use crate::backend::{AcquireRequest, Backend, LeaseInfo, PermitKind};
#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use crate::guard::LeaseGuard;
use crate::key::{validate_prefix, Key};
use crate::local::LocalQueues;
use crate::observe::Observer;
use crate::pending::PendingReleases;
use crate::renewal::RenewalScheduler;
use crate::stats::Stats;

mod acquire;
mod in_flight;
mod options;

pub use options::AcquireOptions;

/// How long past the caller's wait bound (for a try-once call: past its
/// start) the core waits for a store that has not answered an attempt,
/// before it gives the attempt up and reports [`Error::Unavailable`]: the
/// "one round trip" of the promise that a call returns within its bound
/// plus one round trip. Stores bound their own lock waits by the wait
/// ([`AcquireRequest::lock_wait`]); this is the backstop for a store that
/// does not answer at all (a black-holed connection, a stuck server).
pub const STORE_ANSWER_GRACE: Duration = Duration::from_secs(1);

/// How long [`Locks::close`] waits for the store to close its connections.
pub const CLOSE_BOUND: Duration = Duration::from_secs(5);

/// The client handle: one store, shared by every lock this process takes.
///
/// Cheap to clone (an `Arc`). Open one from a URL with [`Locks::open`], or wrap
/// a backend you built with [`Locks::new`].
#[derive(Clone)]
pub struct Locks {
    backend: Arc<dyn Backend>,
    holder_label: Arc<str>,
    local: Arc<LocalQueues>,
    /// The local queues of semaphore keys: apart from the mutexes'.
    permit_queues: Arc<LocalQueues>,
    /// Waiters for reader-writer locks, apart from semaphores of the same key.
    rw_queues: Arc<LocalQueues>,
    renewals: RenewalScheduler,
    pending: Arc<PendingReleases>,
    /// Counts for `stats()` and the metrics (observe.rs).
    observer: Arc<Observer>,
    /// Whether mutex waiters queue at the store unless their options say
    /// otherwise ([`Locks::with_fair`]).
    fair: bool,
}

impl fmt::Debug for Locks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Locks")
            .field("backend", &self.backend)
            .field("holder_label", &self.holder_label)
            .finish()
    }
}

/// `host:pid`, stored beside each lease so humans can see who holds it.
fn default_holder_label() -> String {
    let host = gethostname::gethostname();
    format!("{}:{}", host.to_string_lossy(), std::process::id())
}

impl Locks {
    /// Wraps a backend.
    pub fn new(backend: impl Backend) -> Self {
        Self::from_arc(Arc::new(backend))
    }

    /// Wraps a shared backend.
    pub fn from_arc(backend: Arc<dyn Backend>) -> Self {
        Locks {
            observer: Observer::new(&*backend),
            backend,
            holder_label: default_holder_label().into(),
            local: Arc::default(),
            permit_queues: Arc::default(),
            rw_queues: Arc::default(),
            renewals: RenewalScheduler::default(),
            pending: Arc::default(),
            fair: false,
        }
    }

    /// Measures lease deadlines on `clock` (tests suspend the machine).
    #[cfg(test)]
    pub(crate) fn with_lease_clock(mut self, clock: crate::time::LeaseClock) -> Self {
        self.renewals = RenewalScheduler::new(clock, self.renewals.background().clone());
        self
    }

    /// Runs this handle's background work on `runtime` instead of the
    /// library's own thread: the renewal of its guards (and their lost
    /// signal), and the completion of acquire attempts whose caller went
    /// away outside any runtime (a grant they bring is released; dropped on
    /// a runtime, an attempt is finished on that one).
    ///
    /// By default that work runs on a thread the library starts on first
    /// use, with a runtime of its own, so that it goes on whatever happens
    /// to the runtimes of the callers: a handle used from several runtimes
    /// keeps renewing the guards of each after another one ends. Name a
    /// runtime only if it outlives every guard of this handle (and its
    /// clones): when it shuts down, renewal stops and guards are lost
    /// without their [`lost`](LeaseGuard::lost) signal firing. Uses: a
    /// program or binding that owns the process's one runtime and wants no
    /// extra thread, and tests on paused time (`start_paused`), whose clock
    /// then drives renewal as it drives the test (on the library's thread,
    /// renewal runs on real time, which a paused test clock does not
    /// follow). Set it before the first acquisition.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use leasehold::backends::memory::MemoryBackend;
    /// use leasehold::Locks;
    /// let locks = Locks::new(MemoryBackend::new())
    ///     .with_background_runtime(tokio::runtime::Handle::current());
    /// # drop(locks);
    /// # }
    /// ```
    pub fn with_background_runtime(mut self, runtime: tokio::runtime::Handle) -> Self {
        self.renewals = RenewalScheduler::new(
            self.renewals.clock().clone(),
            crate::background::Background::On(runtime),
        );
        self
    }

    setters! {
        /// Replaces the human label stored beside each lease (default `host:pid`).
        with_holder_label(label: &str) => holder_label = label.into();

        /// Whether the mutex waiters of this handle (and its clones) queue
        /// at the store, first come, first served across processes, unless
        /// an acquire's own [`AcquireOptions::with_fair`] says otherwise.
        /// Default false: on the stores that queue, fair waiting passes
        /// fewer acquisitions per second under contention (docs/fairness.md,
        /// "Why opt-in"), so a service turns it on for the handle whose
        /// keys must be served in order (a flash sale's products).
        ///
        /// ```
        /// use leasehold::backends::memory::MemoryBackend;
        /// use leasehold::Locks;
        /// let locks = Locks::new(MemoryBackend::new()).with_fair(true);
        /// # drop(locks);
        /// ```
        with_fair(fair: bool) => fair = fair;
    }

    /// The human label stored beside each lease.
    pub(crate) fn holder_label(&self) -> &str {
        &self.holder_label
    }

    /// Takes a semaphore permit: the mutex's engine on the permit queues.
    pub(crate) async fn acquire_permit(
        &self,
        request: AcquireRequest,
        options: &AcquireOptions,
    ) -> Result<LeaseGuard> {
        let span = tracing::debug_span!("acquire_permit", key = %request.key(), kind = ?request.permit_kind(), ttl = ?options.ttl);
        self.acquire_request(request, options)
            .instrument(span)
            .await
    }

    /// The local queues for `request`'s kind of lock.
    fn queues(&self, request: &AcquireRequest) -> &Arc<LocalQueues> {
        match request.permit_kind() {
            Some(PermitKind::Semaphore(_)) => &self.permit_queues,
            Some(PermitKind::Read | PermitKind::Write) => &self.rw_queues,
            None => &self.local,
        }
    }

    /// What this handle (and its clones) did since it was opened: counts
    /// and wait/hold quantiles, kept without any metrics recorder (see
    /// [`Stats`] for an example). Cheap: a few hundred relaxed loads.
    pub fn stats(&self) -> Stats {
        self.observer.stats()
    }

    /// The store behind this handle.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// Closes the store's connections (see [`Backend::shutdown`]); call it
    /// last, before the tokio runtime ends, in a program that exits soon
    /// after. Clones of this handle and guards still alive then fail their
    /// store operations with errors (a lease that cannot be renewed is
    /// lost). Dropping the handle instead is fine in a long-lived runtime.
    ///
    /// Today only the MongoDB store needs it: its driver can panic when the
    /// runtime stops under a request in flight.
    ///
    /// It does not release the leases of guards that are still alive: each
    /// [`LeaseGuard`] owns its lease, and releasing it behind the guard's
    /// back would leave that guard reporting a lease it no longer has
    /// (until its next renewal), while a clone of this handle may still be
    /// in use. Release or drop the guards first; a binding that hands
    /// leases to code it does not own (the Node package) keeps its own list
    /// of the guards it still holds and releases them in its `close()`.
    ///
    /// Bounded: a store whose shutdown has not finished after
    /// [`CLOSE_BOUND`] is left to the end of the process (with a warning),
    /// so that a program never hangs on its way out. A `leasehold run` on
    /// MongoDB was once seen stuck here for minutes, deaf to SIGTERM, with
    /// no connection left, while the server was loaded.
    pub async fn close(self) {
        if tokio::time::timeout(CLOSE_BOUND, self.backend.shutdown())
            .await
            .is_err()
        {
            tracing::warn!(
                bound = ?CLOSE_BOUND,
                "the store did not finish closing its connections in time; left to the process's end"
            );
        }
    }

    /// Tries once to take `key` with the default ttl (30 s).
    ///
    /// # Errors
    /// [`Error::Busy`] if somebody holds it; [`Error::InvalidInput`] for a bad
    /// key; [`Error::Unavailable`]/[`Error::Backend`] from the store.
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped while an attempt is at the
    /// store, the attempt is finished in the background (see
    /// [`with_background_runtime`](Self::with_background_runtime)) and a
    /// grant it brings is released at once, not left held for its ttl.
    pub async fn try_acquire(&self, key: &str) -> Result<LeaseGuard> {
        self.acquire_with(key, &AcquireOptions::new()).await
    }

    /// Takes `key` with the default ttl, waiting up to `wait` for the holder
    /// to let go.
    ///
    /// # Errors
    /// [`Error::Timeout`] if not acquired within `wait`; otherwise as
    /// [`try_acquire`](Self::try_acquire).
    ///
    /// # Cancel safety
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn acquire(&self, key: &str, wait: Duration) -> Result<LeaseGuard> {
        self.acquire_with(key, &AcquireOptions::new().with_wait(wait))
            .await
    }

    /// Takes `key` as `options` say.
    ///
    /// Without a wait bound this tries once. With one, a busy attempt sleeps
    /// until the earliest of: a release notification from the store, the
    /// holder's remaining ttl, a jittered backoff, the wait bound. The wait
    /// never runs past its bound.
    ///
    /// With [`AcquireOptions::with_fair`] on a store that keeps queues
    /// ([`Backend::queues`]), a waiter for a mutex queues at the store,
    /// first come, first served across processes, and is handed the key
    /// at a release (docs/fairness.md). Otherwise, waiters for the same key on this handle (and its clones) queue in
    /// FIFO order and only the first waits at the store, so a task that
    /// releases and re-acquires in a loop cannot starve its neighbours.
    /// A guard of this process does not hold that queue: the first local
    /// waiter gets the key as soon as the store frees it, even if the guard
    /// still lives (its lease lost). A [`try_acquire`](Self::try_acquire)
    /// (no wait) does not queue and simply asks the store.
    /// Across processes, without queues at the store, the store decides,
    /// with no fairness guarantee.
    /// Errors from the store end the wait at once.
    ///
    /// Subscribing to the store's release notifications never delays the
    /// wait past its bound: if it is slow or refused, the waiter polls.
    ///
    /// The call returns within its wait bound plus one round trip: a store
    /// waits for a record that another transaction has locked only until
    /// the bound (at least [`TRY_ONCE_LOCK_WAIT`](crate::backend::TRY_ONCE_LOCK_WAIT))
    /// and then counts the key busy, and an attempt the store has not
    /// answered [`STORE_ANSWER_GRACE`] after the bound is given up
    /// ([`Error::Unavailable`]; a grant that attempt still brings is
    /// released in the background, as when the caller drops the future). A grant that arrives after its lease
    /// already ended is released too and counts as busy, so a returned
    /// guard is never born lost. An acquisition waits first for a release
    /// of the same key that a guard dropped through this handle (or a
    /// clone) still has in flight.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] (before any I/O) for a bad key or ttl;
    /// [`Error::Busy`] when trying once; [`Error::Timeout`] when the wait
    /// bound passes; [`Error::Cancelled`] when the cancel token fires;
    /// [`Error::Unavailable`]/[`Error::Backend`] from the store.
    ///
    /// # Cancel safety
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn acquire_with(&self, key: &str, options: &AcquireOptions) -> Result<LeaseGuard> {
        let key = Key::new(key)?;
        let request = AcquireRequest::new(key, options.ttl, &self.holder_label)?;
        // The labels and the outcome are recorded by the probe (observe.rs).
        let span = tracing::debug_span!(
            "acquire",
            key = %request.key(),
            ttl = ?options.ttl,
            store = tracing::field::Empty,
            primitive = tracing::field::Empty,
            lock_class = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        self.acquire_request(request, options)
            .instrument(span)
            .await
    }

    /// The live holder of `key`, if any.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a bad key; store errors otherwise.
    pub async fn inspect(&self, key: &str) -> Result<Option<LeaseInfo>> {
        let key = Key::new(key)?;
        let span = tracing::debug_span!("inspect", key = %key);
        self.backend.inspect(&key).instrument(span).await
    }

    /// Live holders of every mutex whose key starts with `prefix` (`""`
    /// for all), ordered by key. Semaphore permits and reader-writer
    /// holders are in [`list_permits`](Self::list_permits); all of them
    /// at once in [`list_holders`](Self::list_holders).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a prefix over 256 bytes or with control
    /// characters; store errors otherwise.
    pub async fn list(&self, prefix: &str) -> Result<Vec<LeaseInfo>> {
        let mut all = self.list_holders(prefix).await?;
        all.retain(|info| info.slot.is_none());
        Ok(all)
    }

    /// Every live holder of every key starting with `prefix` (`""` for
    /// all), in one store listing: mutex holders, semaphore permits and
    /// reader-writer holders ([`LeaseInfo::slot`] and [`LeaseInfo::rw`]
    /// say which), ordered by key, then a mutex's holder, the semaphore's
    /// permits and the lock's holders, then slot.
    ///
    /// # Errors
    /// As [`list`](Self::list).
    pub async fn list_holders(&self, prefix: &str) -> Result<Vec<LeaseInfo>> {
        validate_prefix(prefix)?;
        let span = tracing::debug_span!("list", prefix);
        self.backend.list(prefix).instrument(span).await
    }

    /// Admin break: frees `key` whoever holds it and bumps its fence, so the
    /// evicted holder's token is rejected by fenced resources. Returns whether
    /// a live lease was broken.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a bad key; store errors otherwise.
    pub async fn force_release(&self, key: &str) -> Result<bool> {
        let key = Key::new(key)?;
        let span = tracing::info_span!("force_release", key = %key);
        self.backend.force_release(&key).instrument(span).await
    }
}
