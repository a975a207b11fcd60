//! [`Locks`], the client handle, and the acquisition engine every store
//! shares: validation, waiting with wake-ups, backoff, deadlines.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{sleep_until, timeout_at, Instant};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backend::{
    Acquire, AcquireRequest, Backend, BoxFuture, Busy, KeyKind, Lease, LeaseInfo, PermitKind,
};
use crate::error::{Error, Result};
use crate::guard::{born_dead, Granted, LeaseGuard};
use crate::key::{validate_prefix, Key};
use crate::local::LocalQueues;
use crate::notify::Subscription;
use crate::observe::{AcquireProbe, Observer, Primitive};
use crate::pending::PendingReleases;
use crate::queue::QueueSeat;
use crate::renewal::RenewalScheduler;
use crate::stats::Stats;
use crate::time::{Backoff, DEFAULT_TTL};

/// How long past the caller's wait bound (for a try-once call: past its
/// start) the core waits for a store that has not answered an attempt,
/// before it gives the attempt up and reports [`Error::Unavailable`]: the
/// "one round trip" of the promise that a call returns within its bound
/// plus one round trip. Stores bound their own lock waits by the wait
/// ([`AcquireRequest::lock_wait`]); this is the backstop for a store that
/// does not answer at all (a black-holed connection, a stuck server).
pub const STORE_ANSWER_GRACE: Duration = Duration::from_secs(1);

/// The holder label reported when the store granted the lease but the grant
/// arrived after the lease it started had already ended (the request took
/// longer than the ttl): the grant is given back and the attempt counts as
/// busy.
const LATE_GRANT: &str = "(a grant that arrived after its lease ended)";

/// How long [`Locks::close`] waits for the store to close its connections.
pub const CLOSE_BOUND: Duration = Duration::from_secs(5);

/// How to acquire: lease length, how long to wait, cancellation, renewal.
///
/// ```
/// use std::time::Duration;
/// use leasehold::AcquireOptions;
/// let opts = AcquireOptions::new()
///     .with_ttl(Duration::from_secs(10))
///     .with_wait(Duration::from_secs(2));
/// assert_eq!(opts.ttl(), Duration::from_secs(10));
/// ```
#[derive(Debug, Clone)]
pub struct AcquireOptions {
    ttl: Duration,
    wait: Option<Duration>,
    cancel: Option<CancellationToken>,
    auto_renew: bool,
    /// Whether a waiter queues at a store that keeps queues (queue.rs);
    /// `None`: as its handle says ([`Locks::with_fair`]).
    fair: Option<bool>,
    /// The `lock_class` label of metrics (observe.rs).
    lock_class: Option<Arc<str>>,
    /// The `primitive` label, when a multi-lock or election takes the lock.
    primitive: Option<Primitive>,
}

impl Default for AcquireOptions {
    fn default() -> Self {
        AcquireOptions {
            ttl: DEFAULT_TTL,
            wait: None,
            cancel: None,
            auto_renew: true,
            fair: None,
            lock_class: None,
            primitive: None,
        }
    }
}

impl AcquireOptions {
    /// Defaults: ttl 30 s, try once (no waiting), renew automatically.
    pub fn new() -> Self {
        Self::default()
    }

    setters! {
        /// Lease length, 100 ms ..= 24 h (checked when acquiring).
        with_ttl(ttl: Duration) => ttl = ttl;

        /// Wait up to `wait` for a busy lock (`Duration::ZERO` tries once).
        with_wait(wait: Duration) => wait = Some(wait);

        /// Stop waiting when `cancel` is cancelled ([`Error::Cancelled`]).
        with_cancel(cancel: CancellationToken) => cancel = Some(cancel);

        /// Whether the guard renews itself every ttl/3 (default true). Without
        /// renewal the lease simply lasts one ttl and `lost()` fires then.
        with_auto_renew(auto_renew: bool) => auto_renew = auto_renew;

        /// Whether a waiter for a mutex takes its place in the key's queue
        /// at the store (default: as the handle says, [`Locks::with_fair`],
        /// which is false unless set), where the store keeps one
        /// ([`Backend::queues`]: memory, SQLite, PostgreSQL, Redis, MongoDB): waiters from every
        /// process get the key first come, first served, and a release
        /// hands it to the first of them directly, waking it alone. Off,
        /// or on a store without queues: the waiters of each process line
        /// up locally and race the other processes at each release, which
        /// on SQLite, PostgreSQL, Redis and MongoDB today passes more acquisitions per second under
        /// contention but lets a waiter lose races for its whole wait
        /// (docs/fairness.md has the measurements).
        with_fair(fair: bool) => fair = Some(fair);

        /// Names the lock's class for the metrics (feature `metrics`, label
        /// `lock_class`): one of a few stable names such as `"invoices"`,
        /// never a per-key value. Default: the key up to
        /// its first `:` (`"orders:42"` is `"orders"`), or `"other"`. At
        /// most 64 bytes, no control characters (checked when acquiring).
        with_lock_class(class: &str) => lock_class = Some(class.into());
    }

    /// The lock class named with [`with_lock_class`](Self::with_lock_class).
    pub(crate) fn lock_class(&self) -> Option<&Arc<str>> {
        self.lock_class.as_ref()
    }

    /// The primitive that takes the lock, if not the request's own kind.
    pub(crate) fn primitive(&self) -> Option<Primitive> {
        self.primitive
    }

    /// These options, for a lock `primitive` takes (a multi-lock's part).
    pub(crate) fn for_primitive(&self, primitive: Primitive) -> Self {
        AcquireOptions {
            primitive: Some(primitive),
            ..self.clone()
        }
    }

    /// The lease length asked for.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The wait bound, if any.
    pub fn wait(&self) -> Option<Duration> {
        self.wait
    }
}

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

    async fn acquire_request(
        &self,
        request: AcquireRequest,
        options: &AcquireOptions,
    ) -> Result<LeaseGuard> {
        let probe = AcquireProbe::start(
            &self.observer,
            &request,
            options.lock_class(),
            options.primitive(),
            options.wait().is_some_and(|w| !w.is_zero()),
        )?;
        let result = self.acquire_observed(request, options, &probe).await;
        probe.finish(&result);
        result
    }

    async fn acquire_observed(
        &self,
        request: AcquireRequest,
        options: &AcquireOptions,
        probe: &AcquireProbe,
    ) -> Result<LeaseGuard> {
        let started = Instant::now();
        let wait = options.wait.unwrap_or(Duration::ZERO);
        // A wait too long to represent is as good as no bound.
        let deadline = started.checked_add(wait);
        // The store bounds its own lock waits by the caller's deadline.
        let mut request = Arc::new(match deadline {
            Some(d) => request.with_lock_deadline(d),
            None => request,
        });
        let backstop = deadline.and_then(|d| d.checked_add(STORE_ANSWER_GRACE));
        // A waiter for a mutex queues at a store that keeps queues, in the
        // order of every process's waiters (queue.rs); elsewhere local
        // waiters for the key queue first, and only the front one waits at
        // the store (see local.rs).
        let mut seat = (!wait.is_zero()
            && options.fair.unwrap_or(self.fair)
            && request.permit_kind().is_none()
            && self.backend.queues())
        .then(|| {
            QueueSeat::new(
                self.backend.clone(),
                &request,
                self.renewals.background().clone(),
            )
        });
        let turn = if wait.is_zero() || seat.is_some() {
            None
        } else {
            tokio::select! {
                biased;
                _ = cancelled(options) => return Err(Error::Cancelled { key: request.key().to_string() }),
                turn = self.queues(&request).turn(request.key()) => Some(turn),
                _ = sleep_until_some(deadline) => return Err(self.timeout(&request, started, None)),
            }
        };
        // A release of this key that a dropped guard of this handle still
        // has in flight goes first: asked before it lands, the store would
        // answer busy with our own old lease. Bounded like an attempt.
        tokio::select! {
            biased;
            _ = cancelled(options) => return Err(Error::Cancelled { key: request.key().to_string() }),
            _ = self.pending.settled(request.key()) => {}
            _ = sleep_until_some(backstop) => {}
        }
        let mut waiting: Option<Waiting> = None;
        loop {
            // On the lease clock, which counts suspended time (time.rs).
            let sent_at = self.renewals.clock().now();
            if let Some(seat) = seat.as_mut() {
                request = Arc::new(seat.next_attempt(&request, sent_at));
            }
            probe.attempt();
            let busy = match self.attempt(&request, backstop, options).await? {
                Acquire::Granted(lease) if born_dead(self.renewals.clock(), &lease, sent_at) => {
                    tracing::warn!(
                        token = lease.token(),
                        "the grant arrived after its lease had ended; giving it back"
                    );
                    self.give_back(&lease, backstop).await;
                    Busy {
                        holder: LATE_GRANT.to_owned(),
                        remaining: Duration::ZERO,
                    }
                }
                Acquire::Granted(lease) => {
                    tracing::debug!(token = lease.token(), "granted");
                    if let Some(seat) = seat.as_mut() {
                        seat.settle();
                    }
                    return Ok(self.guard(
                        lease,
                        Granted::Asked(sent_at),
                        options,
                        &request,
                        turn,
                        probe,
                    ));
                }
                Acquire::Busy(busy) => busy,
                Acquire::OtherKind(KeyKind::ReaderWriter) if request.permit_kind().is_none() => {
                    // One key is one lock: the exclusive acquire of a
                    // reader-writer lock's key is its writer (it waits for
                    // the readers and excludes them). Asked at once, and
                    // from now on this loop asks for the writer only.
                    tracing::debug!("the key is a reader-writer lock; acquiring its writer");
                    request = Arc::new(request.as_writer());
                    // A writer does not queue at the store: this request
                    // never entered the mutex's queue (the kind is checked
                    // first), so there is nothing to leave.
                    if let Some(mut seat) = seat.take() {
                        seat.settle();
                    }
                    continue;
                }
                Acquire::OtherKind(held) => {
                    // Another kind cannot be shared: refused, never waited on.
                    return Err(Error::KindMismatch {
                        key: request.key().to_string(),
                        held,
                        requested: request.key_kind(),
                    });
                }
            };
            if wait.is_zero() {
                return Err(Error::Busy {
                    key: request.key().to_string(),
                    holder: busy.holder,
                    remaining: busy.remaining,
                    kind: lock_kind(&request),
                });
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Err(self.timeout(&request, started, Some((busy, now))));
            }
            if let Some(seat) = seat.as_mut() {
                seat.busy();
            }
            let Some(w) = waiting.as_mut() else {
                // Subscribe, then try again at once: a release between the
                // first attempt and the subscription would otherwise be missed.
                let mut w = Waiting::start(&*self.backend, request.key(), deadline).await?;
                if seat.is_some() {
                    w.subscription.expect_hand_off(request.owner());
                }
                waiting = Some(w);
                continue;
            };
            // Wake just after the holder's lease ends at the latest; a
            // queued waiter renews its entry in time too.
            let until_expiry = busy.remaining + Duration::from_millis(1);
            let next = match seat.as_mut() {
                // The hand-off wakes it; polling only where it cannot.
                Some(seat) if w.subscription.is_live() => seat.next_refresh(),
                Some(seat) => seat.next_refresh().min(w.backoff.next_delay()),
                None => w.backoff.next_delay(),
            };
            let mut wake_at = now + until_expiry.min(next);
            if let Some(d) = deadline {
                wake_at = wake_at.min(d);
            }
            tracing::trace!(holder = %busy.holder, remaining = ?busy.remaining, "busy, waiting");
            tokio::select! {
                biased;
                _ = cancelled(options) => {
                    return Err(Error::Cancelled { key: request.key().to_string() });
                }
                _ = w.subscription.notified() => probe.woken(),
                _ = sleep_until(wake_at) => {}
            }
            // A grant handed over to this waiter: its guard needs no
            // further round trip (queue.rs).
            if let (Some(seat), Some(grant)) = (seat.as_mut(), w.subscription.hand_off()) {
                if let Some(counts_from) = seat.counts_from(grant) {
                    let lease = request.granted(grant.token);
                    let granted = Granted::HandedOver {
                        counts_from,
                        claim_window: request.claim_window(),
                    };
                    if !granted.born_dead(self.renewals.clock(), &lease) {
                        tracing::debug!(token = lease.token(), "handed over");
                        seat.settle();
                        probe.handed_over();
                        return Ok(self.guard(lease, granted, options, &request, turn, probe));
                    }
                    // Too old to trust: the next attempt, a repeat, claims
                    // it if it is still ours.
                    continue;
                }
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(self.timeout(&request, started, Some((busy, now))));
            }
        }
    }

    /// The guard of a grant, counted on this handle's queues, with the
    /// local turn given up (the next local waiter may go to the store now:
    /// local.rs).
    fn guard(
        &self,
        lease: Lease,
        granted: Granted,
        options: &AcquireOptions,
        request: &AcquireRequest,
        turn: Option<crate::local::LocalTurn>,
        probe: &AcquireProbe,
    ) -> LeaseGuard {
        let hold = self.queues(request).hold(request.key());
        drop(turn);
        LeaseGuard::start(
            self.backend.clone(),
            &self.renewals,
            lease,
            granted,
            options.auto_renew,
            hold,
            self.pending.clone(),
        )
        .observed(probe.tally())
    }

    /// One attempt at the store, raced against the cancel token and the
    /// backstop. An attempt cut short, here or because the caller dropped
    /// the acquisition, is not abandoned (the store may already have
    /// granted it, and the grant would then hold the key for a ttl with
    /// nobody renewing or releasing it): [`InFlight`] finishes it in the
    /// background and releases a grant it brings.
    async fn attempt(
        &self,
        request: &Arc<AcquireRequest>,
        backstop: Option<Instant>,
        options: &AcquireOptions,
    ) -> Result<Acquire> {
        let backend = self.backend.clone();
        let owned = request.clone();
        let mut attempt = InFlight {
            attempt: Some(Box::pin(async move { backend.try_acquire(&owned).await })),
            locks: self,
            request,
        };
        tokio::select! {
            biased;
            outcome = &mut attempt => outcome,
            _ = cancelled(options) => Err(Error::Cancelled { key: request.key().to_string() }),
            _ = sleep_until_some(backstop) => Err(Error::unavailable(format!(
                "the store did not answer an acquire of {:?} within {STORE_ANSWER_GRACE:?} after the wait bound",
                request.key().as_str()
            ))),
        }
    }

    /// Releases a grant that will not become a guard, within the backstop
    /// (past it the lease simply expires). The release runs on a task of
    /// the background runtime, so a caller that goes away meanwhile does
    /// not cut it short; it is recorded as pending, so a later acquisition
    /// of the key through this handle waits for it.
    async fn give_back(&self, lease: &Lease, backstop: Option<Instant>) {
        let (done, finished) = tokio::sync::oneshot::channel::<()>();
        let backend = self.backend.clone();
        let lease = lease.clone();
        let pending = self.pending.begin(lease.key());
        self.renewals.background().spawn(async move {
            let _pending = pending;
            give_back(&*backend, &lease).await;
            let _ = done.send(());
        });
        tokio::select! {
            _ = finished => {}
            _ = sleep_until_some(backstop) => {}
        }
    }

    /// The timeout error, with the holder of the last busy answer (`seen`,
    /// and when it came) and what remains of its lease now.
    fn timeout(
        &self,
        request: &AcquireRequest,
        started: Instant,
        seen: Option<(Busy, Instant)>,
    ) -> Error {
        let (holder, remaining) = match seen {
            Some((busy, at)) => (
                Some(busy.holder),
                Some(busy.remaining.saturating_sub(at.elapsed())),
            ),
            None => (None, None),
        };
        Error::Timeout {
            key: request.key().to_string(),
            waited: started.elapsed(),
            held_here: self.queues(request).is_held_here(request.key()),
            holder,
            remaining,
        }
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

/// An acquire attempt at the store that is finished even if nobody waits
/// for it any more. Polled in place, so the common case (the caller takes
/// the answer) costs no task; dropped before its answer (the caller went
/// away: a dropped future, a `select!`, a disconnected HTTP client, or the
/// cancel token or backstop in [`Locks::attempt`]), it moves the attempt to
/// a task of the runtime it was dropped on (the background runtime outside
/// any), which waits for the answer (for at most a ttl: after that a grant
/// has expired anyway) and releases a grant at once. A runtime that ends
/// first ends the attempt too; its grant, if the store made one, expires.
/// While that release is on its way the key's next acquisition through
/// this handle waits for it, as for a dropped guard's release (not while
/// the answer is still awaited: a store that never answers would hold the
/// key up for a ttl).
struct InFlight<'a> {
    attempt: Option<BoxFuture<'static, Result<Acquire>>>,
    locks: &'a Locks,
    request: &'a Arc<AcquireRequest>,
}

impl Future for InFlight<'_> {
    type Output = Result<Acquire>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(attempt) = self.attempt.as_mut() else {
            // Polled after its answer: there is nothing more to come.
            return Poll::Pending;
        };
        let outcome = std::task::ready!(attempt.as_mut().poll(cx));
        self.attempt = None;
        Poll::Ready(outcome)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let Some(attempt) = self.attempt.take() else {
            return;
        };
        let backend = self.locks.backend.clone();
        let ttl = self.request.ttl();
        let pending = self.locks.pending.clone();
        let finish = async move {
            if let Ok(Ok(Acquire::Granted(lease))) = tokio::time::timeout(ttl, attempt).await {
                // Recorded only once there is a grant to give back: an
                // attempt the store never answers (a hung server) must not
                // hold up the key's next acquisitions for a ttl.
                let _pending = pending.begin(lease.key());
                tracing::debug!(key = %lease.key(), token = lease.token(), "a grant whose caller went away; giving it back");
                give_back(&*backend, &lease).await;
            }
        };
        // The attempt may hold timers and sockets of the runtime it was
        // polled on (the caller's): it is finished there, where they work,
        // and ends with that runtime, which drops its tasks when it shuts
        // down. Polled by another runtime after that one ended, its timer
        // would panic ("A Tokio 1.x context was found, but it is being
        // shutdown"). Dropped outside any runtime: the handle's own.
        match tokio::runtime::Handle::try_current() {
            Ok(caller) => drop(caller.spawn(finish)),
            Err(_) => self.locks.renewals.background().spawn(finish),
        }
    }
}

/// Releases `lease`, logging a failure (the lease then expires by itself).
async fn give_back(backend: &dyn Backend, lease: &Lease) {
    if let Err(e) = backend.release(lease).await {
        tracing::warn!(key = %lease.key(), token = lease.token(), error = %e, "could not give an unused grant back; it will expire");
    }
}

/// Resolves when the caller's cancel token fires; never without one.
async fn cancelled(options: &AcquireOptions) {
    match &options.cancel {
        Some(c) => c.cancelled().await,
        None => std::future::pending().await,
    }
}

/// Sleeps until `deadline`; forever without one.
async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(d) => sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// A waiter's state between attempts: its release subscription and backoff.
struct Waiting {
    subscription: Subscription,
    backoff: Backoff,
}

impl Waiting {
    /// Subscribes to releases of `key`, but by `deadline` at the latest: a
    /// store that is slow to set up its notifications (a pool with no free
    /// connection, a refused or unanswered pub/sub connection) leaves this
    /// waiter polling rather than waiting past its bound.
    async fn start(backend: &dyn Backend, key: &Key, deadline: Option<Instant>) -> Result<Self> {
        let subscribe = backend.subscribe(key);
        let subscription = match deadline {
            Some(d) => timeout_at(d, subscribe).await.unwrap_or_else(|_| {
                tracing::debug!(%key, "release notifications not ready by the deadline; polling");
                Ok(Subscription::never())
            })?,
            None => subscribe.await?,
        };
        let backoff = if subscription.is_live() {
            // Notifications do the work; the timer is only a safety net for
            // a notification lost with a dropped connection.
            Backoff::new(Duration::from_millis(50), Duration::from_secs(2))
        } else {
            Backoff::new(Duration::from_millis(5), Duration::from_millis(250))
        };
        Ok(Waiting {
            subscription,
            backoff,
        })
    }
}

/// What a request asks for, as [`Error::Busy`] names it.
fn lock_kind(request: &AcquireRequest) -> crate::error::LockKind {
    use crate::error::LockKind;
    match request.permit_kind() {
        None => LockKind::Mutex,
        Some(PermitKind::Semaphore(permits)) => LockKind::Semaphore { permits },
        Some(PermitKind::Read) => LockKind::Read,
        Some(PermitKind::Write) => LockKind::Write,
    }
}
