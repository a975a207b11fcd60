//! [`AcquireOptions`]: how one acquisition goes (lease length, wait bound,
//! cancellation, renewal, fairness, metrics labels).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::observe::Primitive;
use crate::time::DEFAULT_TTL;

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
    pub(super) ttl: Duration,
    pub(super) wait: Option<Duration>,
    pub(super) cancel: Option<CancellationToken>,
    pub(super) auto_renew: bool,
    /// Whether a waiter queues at a store that keeps queues (queue.rs);
    /// `None`: as its handle says ([`Locks::with_fair`](super::Locks::with_fair)).
    pub(super) fair: Option<bool>,
    /// Whether a grant handed over is claimed at once (guard.rs).
    pub(super) prompt_claim: bool,
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
            prompt_claim: false,
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

        /// Stop waiting when `cancel` is cancelled ([`Error::Cancelled`](crate::error::Error::Cancelled)).
        with_cancel(cancel: CancellationToken) => cancel = Some(cancel);

        /// Whether the guard renews itself every ttl/3 (default true). Without
        /// renewal the lease simply lasts one ttl and `lost()` fires then.
        with_auto_renew(auto_renew: bool) => auto_renew = auto_renew;

        /// Whether a waiter for a mutex takes its place in the key's queue
        /// at the store (default: as the handle says, [`Locks::with_fair`](super::Locks::with_fair),
        /// which is false unless set), where the store keeps one
        /// ([`Backend::queues`](crate::backend::Backend::queues): memory, SQLite, PostgreSQL, Redis, MongoDB, etcd): waiters from every
        /// process get the key first come, first served, and a release
        /// hands it to the first of them directly, waking it alone. Off,
        /// or on a store without queues: the waiters of each process line
        /// up locally and race the other processes at each release, which
        /// on SQLite, PostgreSQL, Redis, MongoDB and etcd today passes more acquisitions per second under
        /// contention but lets a waiter lose races for its whole wait
        /// (docs/fairness.md has the measurements).
        with_fair(fair: bool) => fair = Some(fair);

        /// Whether a grant handed over by the store's queue (see
        /// [`with_fair`](Self::with_fair)) is claimed at once, in the
        /// background, rather than at its first renewal. A grant handed
        /// over lasts only the claim window (at most 2 s) until the guard
        /// claims it with a renewal, which gives it the whole ttl; by
        /// default that renewal comes a third into the window, like any
        /// renewal a third into its lease, because most holds end before
        /// and the claim is then a store write saved. On, the claim is
        /// sent as the guard is made (one write more per hand-off), and
        /// [`LeaseGuard::valid_until`](crate::LeaseGuard::valid_until)
        /// covers the whole ttl one round trip later: for a caller that
        /// plans from `valid_until` before it starts its work (the CLI's
        /// `run` schedules its command's SIGTERM from it). Default false;
        /// no effect on a grant the caller's own attempt took.
        with_prompt_claim(prompt_claim: bool) => prompt_claim = prompt_claim;

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
