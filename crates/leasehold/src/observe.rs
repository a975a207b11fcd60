//! What the engine tells about itself: one call per event (an acquisition
//! starts, makes an attempt, ends; a guard is born, renews, is lost, ends),
//! fanned out to the counters behind [`Locks::stats`](crate::Locks::stats)
//! and, with the `metrics` feature, to the `metrics` facade.
//!
//! The engine (lock/acquire.rs, guard.rs) only holds an [`AcquireProbe`] or a
//! [`Tally`] and calls it; every rule about labels, outcomes and what is
//! counted lives here, so the engine's files keep a few separate lines.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, PoisonError, RwLock};

use tokio::time::Instant;

use crate::backend::{AcquireRequest, Backend, PermitKind};
use crate::error::Error;
pub(crate) use crate::events::{Lost, Outcome, Renewal};
use crate::stats::Counters;

/// The kind of lock an event is about (the `primitive` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Primitive {
    Mutex,
    Semaphore,
    RwLock,
    Multi,
    Election,
}

impl Primitive {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Primitive::Mutex => "mutex",
            Primitive::Semaphore => "semaphore",
            Primitive::RwLock => "rwlock",
            Primitive::Multi => "multi",
            Primitive::Election => "election",
        }
    }

    /// What a request is, unless its caller (multi-lock, election) said.
    fn of(request: &AcquireRequest) -> Self {
        match request.permit_kind() {
            None => Primitive::Mutex,
            Some(PermitKind::Semaphore(_)) => Primitive::Semaphore,
            Some(PermitKind::Read | PermitKind::Write) => Primitive::RwLock,
        }
    }
}

/// The class of a key when its caller named none: the key up to its first
/// `:` (`"orders:42"` is `"orders"`), or `"other"` for a key without one,
/// so that the label's values stay few whatever the keys are. The raw key
/// is never a label.
pub(crate) fn default_class(key: &str) -> &str {
    match key.split_once(':') {
        Some((prefix, _)) if !prefix.is_empty() => prefix,
        _ => "other",
    }
}

/// The longest lock class accepted, in bytes.
const MAX_CLASS_BYTES: usize = 64;

/// A lock class named by the caller: 1 to 64 bytes, no control characters
/// (it becomes a label value in whatever the application exports to).
fn validate_class(class: &str) -> crate::error::Result<&str> {
    crate::key::check_name("lock class", class, MAX_CLASS_BYTES)?;
    Ok(class)
}

/// The store's name for labels: `memory`, `sqlite`, `postgres`, `redis`,
/// `mongodb`, taken from the store type's `Debug` name (`SqliteBackend`),
/// so that a store built outside the crate is named too.
fn store_kind(backend: &dyn Backend) -> Arc<str> {
    let debug = format!("{backend:?}");
    let name: String = debug
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    let name = name.strip_suffix("Backend").unwrap_or(&name);
    let name = if name.is_empty() { "custom" } else { name };
    name.to_ascii_lowercase().into()
}

/// Classes interned per primitive and handle. Past this many a class gets
/// a series of its own per acquisition: still labelled right, only without
/// the cached metric handles (the label's values should be few anyway).
const MAX_INTERNED: usize = 256;

/// The five primitives, for per-primitive tables.
const PRIMITIVES: usize = 5;

/// One handle's observer: its store's name, its counters and the series
/// (primitive, lock class) its locks were labelled with so far.
pub(crate) struct Observer {
    store: Arc<str>,
    counters: Counters,
    /// By [`Primitive`] (as an index), then by class: each acquisition
    /// finds its labels (and, with the `metrics` feature, their resolved
    /// metric handles) here instead of building them.
    series: [RwLock<HashMap<Arc<str>, Arc<Series>>>; PRIMITIVES],
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer")
            .field("store", &self.store)
            .finish()
    }
}

impl Observer {
    pub(crate) fn new(backend: &dyn Backend) -> Arc<Self> {
        Arc::new(Observer {
            store: store_kind(backend),
            counters: Counters::default(),
            series: Default::default(),
        })
    }

    pub(crate) fn stats(&self) -> crate::stats::Stats {
        self.counters.snapshot()
    }

    /// The series of `primitive` and `class`, interned while there are
    /// fewer than [`MAX_INTERNED`].
    fn series(&self, primitive: Primitive, class: &str) -> Arc<Series> {
        let table = &self.series[primitive as usize];
        if let Some(found) = table
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(class)
        {
            return found.clone();
        }
        let mut table = table.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(found) = table.get(class) {
            return found.clone();
        }
        let series = Arc::new(Series::new(primitive, class.into()));
        if table.len() < MAX_INTERNED {
            table.insert(series.class.clone(), series.clone());
        }
        series
    }
}

/// The labels of one lock's events (store aside: the observer's), and with
/// the `metrics` feature the metric handles resolved for them.
#[derive(Debug)]
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) struct Series {
    pub(crate) primitive: Primitive,
    pub(crate) class: Arc<str>,
    #[cfg(feature = "metrics")]
    pub(crate) handles: crate::metrics::Handles,
}

impl Series {
    fn new(primitive: Primitive, class: Arc<str>) -> Self {
        Series {
            primitive,
            class,
            #[cfg(feature = "metrics")]
            handles: Default::default(),
        }
    }
}

/// An observer and the series of one lock: what a guard keeps to report
/// its renewals, loss and end.
#[derive(Clone, Debug)]
pub(crate) struct Tally {
    observer: Arc<Observer>,
    series: Arc<Series>,
    /// The span of the lease once granted (`lease`, grant to release): a
    /// loss is an event on it. Disabled before the grant.
    span: tracing::Span,
}

/// The `error_type` label of a store error, or `None` for an error that
/// is not the store's (a timeout, invalid input).
pub(crate) fn store_error_type(error: &Error) -> Option<&'static str> {
    match error {
        Error::Unavailable { .. } => Some("unavailable"),
        Error::Backend { .. } => Some("backend"),
        _ => None,
    }
}

/// One acquisition under way. Dropped without [`finish`](Self::finish)
/// (the caller dropped the call) it counts as cancelled.
pub(crate) struct AcquireProbe {
    tally: Tally,
    /// The acquisition's span (lock/mod.rs's `acquire_with`), given its labels and,
    /// at the end, the outcome.
    span: tracing::Span,
    started: Instant,
    attempts: AtomicU64,
    waits: bool,
    finished: bool,
}

impl AcquireProbe {
    /// An acquisition of `request` starts, labelled with the caller's lock
    /// class and primitive (or those `request` implies); `waits` if it has
    /// a wait bound. (The engine passes its options' parts, so this floor
    /// does not import the engine.)
    pub(crate) fn start(
        observer: &Arc<Observer>,
        request: &AcquireRequest,
        lock_class: Option<&Arc<str>>,
        primitive: Option<Primitive>,
        waits: bool,
    ) -> crate::error::Result<Self> {
        let class = match lock_class {
            Some(class) => validate_class(class)?,
            None => default_class(request.key().as_str()),
        };
        let primitive = primitive.unwrap_or_else(|| Primitive::of(request));
        let tally = Tally {
            observer: observer.clone(),
            series: observer.series(primitive, class),
            span: tracing::Span::none(),
        };
        let span = tracing::Span::current();
        tally.label(&span);
        if waits {
            tally.observer.counters.waiting.fetch_add(1, Relaxed);
            #[cfg(feature = "metrics")]
            crate::metrics::waiting(tally.metrics(), 1.0);
        }
        Ok(AcquireProbe {
            tally,
            span,
            started: Instant::now(),
            attempts: AtomicU64::new(0),
            waits,
            finished: false,
        })
    }

    /// One more attempt at the store.
    pub(crate) fn attempt(&self) {
        self.attempts.fetch_add(1, Relaxed);
    }

    /// A wait woke on news from the store.
    pub(crate) fn woken(&self) {
        self.tally.observer.counters.wakeups.fetch_add(1, Relaxed);
    }

    /// The grant was handed over by the store (counted as granted at the end).
    pub(crate) fn handed_over(&self) {
        self.tally
            .observer
            .counters
            .handed_over
            .fetch_add(1, Relaxed);
    }

    /// The labels of this acquisition, for the guard of its grant.
    pub(crate) fn tally(&self) -> &Tally {
        &self.tally
    }

    /// The acquisition ended with `result`.
    pub(crate) fn finish<T>(mut self, result: &crate::error::Result<T>) {
        let outcome = match result {
            Ok(_) => Outcome::Granted,
            Err(Error::Busy { .. }) => Outcome::Busy,
            Err(Error::Timeout { .. }) => Outcome::Timeout,
            Err(Error::Cancelled { .. }) => Outcome::Cancelled,
            Err(e) => {
                if let Some(kind) = store_error_type(e) {
                    self.tally.store_error(kind, "acquire");
                }
                Outcome::Error
            }
        };
        self.end(outcome);
        self.finished = true;
    }

    fn end(&self, outcome: Outcome) {
        let c = &self.tally.observer.counters;
        let waited = self.started.elapsed();
        let attempts = self.attempts.load(Relaxed);
        let counter = match outcome {
            Outcome::Granted => &c.granted,
            Outcome::Busy => &c.busy,
            Outcome::Timeout => &c.timeout,
            Outcome::Cancelled => &c.cancelled,
            Outcome::Error => &c.failed,
        };
        counter.fetch_add(1, Relaxed);
        self.span.record("outcome", outcome.as_str());
        c.attempts.fetch_add(attempts, Relaxed);
        c.wait.record(waited);
        if self.waits {
            c.waiting.fetch_sub(1, Relaxed);
        }
        #[cfg(feature = "metrics")]
        crate::metrics::acquired(self.tally.metrics(), outcome, waited, attempts, self.waits);
    }
}

impl Drop for AcquireProbe {
    fn drop(&mut self) {
        if !self.finished {
            self.end(Outcome::Cancelled);
        }
    }
}

impl Tally {
    /// This lock's series as the metrics adapter takes it.
    #[cfg(feature = "metrics")]
    fn metrics(&self) -> crate::metrics::SeriesRef<'_> {
        crate::metrics::SeriesRef {
            handles: &self.series.handles,
            store: &self.observer.store,
            primitive: self.series.primitive.as_str(),
            class: &self.series.class,
        }
    }

    /// Gives `span` the labels of this lock (`store`, `primitive`,
    /// `lock_class`: the fields the engine's `acquire`, `renew` and
    /// `release` spans declare empty), as the metrics carry them.
    pub(crate) fn label(&self, span: &tracing::Span) {
        span.record("store", &*self.observer.store);
        span.record("primitive", self.series.primitive.as_str());
        span.record("lock_class", &*self.series.class);
    }

    /// A renewal attempt ended.
    pub(crate) fn renewal(&self, outcome: Renewal) {
        let c = &self.observer.counters;
        match outcome {
            Renewal::Ok => &c.renew_ok,
            Renewal::Failed => &c.renew_failed,
            Renewal::Unknown => &c.renew_unknown,
        }
        .fetch_add(1, Relaxed);
        #[cfg(feature = "metrics")]
        crate::metrics::renewal(self.metrics(), outcome);
    }

    /// A renewal failed with `error`.
    pub(crate) fn renewal_error(&self, error: &Error) {
        self.renewal(Renewal::Failed);
        if let Some(kind) = store_error_type(error) {
            self.store_error(kind, "renew");
        }
    }

    /// The lease was lost.
    pub(crate) fn lost(&self, why: Lost) {
        let c = &self.observer.counters;
        match why {
            Lost::Expired => &c.lost_expired,
            Lost::Gone => &c.lost_gone,
            Lost::Error => &c.lost_error,
        }
        .fetch_add(1, Relaxed);
        // At debug, as the span: the guard warns of the loss itself.
        tracing::debug!(parent: &self.span, reason = why.as_str(), "lease lost");
        #[cfg(feature = "metrics")]
        crate::metrics::lost(self.metrics(), why);
    }

    fn store_error(&self, kind: &'static str, operation: &'static str) {
        self.observer.counters.store_errors.fetch_add(1, Relaxed);
        #[cfg(feature = "metrics")]
        crate::metrics::store_error(self.metrics(), kind, operation);
        #[cfg(not(feature = "metrics"))]
        let _ = (kind, operation);
    }

    /// The guard of a grant starts: its hold ends when it is dropped. The
    /// hold's tally has the lease's span (a child of the acquisition's,
    /// so of the caller's work), on which a loss is recorded.
    pub(crate) fn hold(&self, token: u64) -> HoldWatch {
        self.observer.counters.held.fetch_add(1, Relaxed);
        #[cfg(feature = "metrics")]
        crate::metrics::held(self.metrics(), 1.0);
        let span = tracing::debug_span!(
            "lease",
            token,
            store = tracing::field::Empty,
            primitive = tracing::field::Empty,
            lock_class = tracing::field::Empty,
        );
        self.label(&span);
        HoldWatch {
            tally: Tally {
                span,
                ..self.clone()
            },
            since: Instant::now(),
        }
    }
}

/// A guard's hold: from the grant to the guard's drop (a release drops it).
#[derive(Debug)]
pub(crate) struct HoldWatch {
    tally: Tally,
    since: Instant,
}

impl HoldWatch {
    /// The hold's tally: the lock's labels and the lease's span.
    pub(crate) fn tally(&self) -> &Tally {
        &self.tally
    }
}

impl Drop for HoldWatch {
    fn drop(&mut self) {
        let held = self.since.elapsed();
        let c = &self.tally.observer.counters;
        c.held.fetch_sub(1, Relaxed);
        c.hold.record(held);
        #[cfg(feature = "metrics")]
        crate::metrics::released(self.tally.metrics(), held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_class_is_the_prefix_never_the_key() {
        assert_eq!(default_class("orders:42"), "orders");
        assert_eq!(default_class("orders:42:lines"), "orders");
        assert_eq!(default_class("nightly-report"), "other");
        assert_eq!(default_class(":odd"), "other");
    }

    #[test]
    fn stores_are_named_by_their_type() {
        let memory = crate::backends::memory::MemoryBackend::new();
        assert_eq!(&*store_kind(&memory), "memory");
    }
}
