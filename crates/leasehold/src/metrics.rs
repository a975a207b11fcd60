//! Counters, histograms and gauges through the [`metrics`]
//! facade (feature `metrics`).
//!
//! The library records; the application chooses where the numbers go by
//! installing a recorder (`metrics-exporter-prometheus`, an OpenTelemetry
//! bridge, ...). Without a recorder nothing is kept. Call [`describe`]
//! once after installing one to give each metric its unit and help text.
//!
//! | name | kind | unit | labels |
//! |---|---|---|---|
//! | `leasehold.lock.wait_time` | histogram | s | store, primitive, lock_class, outcome |
//! | `leasehold.lock.attempts` | counter | {attempt} | store, primitive, lock_class, outcome |
//! | `leasehold.lock.use_time` | histogram | s | store, primitive, lock_class |
//! | `leasehold.lock.renewals` | counter | {renewal} | store, primitive, lock_class, outcome |
//! | `leasehold.lock.lost` | counter | {lease} | store, primitive, lock_class, reason |
//! | `leasehold.store.errors` | counter | {error} | store, primitive, lock_class, error_type, operation |
//! | `leasehold.lock.pending_requests` | gauge | {request} | store, primitive, lock_class |
//! | `leasehold.lock.held` | gauge | {lease} | store, primitive, lock_class |
//!
//! The wait and use times follow OpenTelemetry's
//! `db.client.connection.wait_time` / `use_time` (a lease is to a lock what
//! a connection is to a pool); a Prometheus exporter writes the names with
//! `_` for `.` (`leasehold_lock_wait_time`).
//!
//! Labels: `store` (`memory`, `sqlite`, `postgres`, `redis`, `mongodb`),
//! `primitive` (`mutex`, `semaphore`, `rwlock`, `multi`, `election`),
//! `lock_class` (what [`AcquireOptions::with_lock_class`](crate::AcquireOptions::with_lock_class)
//! names, by default the key up to its first `:`, or `other`: never the
//! raw key, so the number of series stays bounded), `outcome` (an
//! acquisition: `granted`, `busy`, `timeout`, `cancelled`, `error`; a
//! renewal: `ok`, `failed`, `unknown`), `reason` (`expired`, `gone`,
//! `error`).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
//! // The application installs a recorder (here none: the calls are no-ops).
//! leasehold::metrics::describe();
//! let locks = leasehold::Locks::open("memory://").await?;
//! let opts = leasehold::AcquireOptions::new().with_lock_class("invoices");
//! let guard = locks.acquire_with("invoice-2024-0042", &opts).await?; // lock_class="invoices"
//! # guard.release().await?; Ok(()) }
//! ```

use std::sync::{Arc, OnceLock, PoisonError, RwLock};
use std::time::Duration;

use ::metrics::{
    describe_counter, describe_gauge, describe_histogram, with_recorder, Counter, Gauge, Histogram,
    Key, Label, Level, Metadata, Recorder, Unit,
};

use crate::events::{Lost, Outcome, Renewal};

/// Durations as the facade records them: seconds, as OpenTelemetry's
/// duration metrics are.
fn seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// Acquisition wait, by outcome (seconds).
pub const WAIT_TIME: &str = "leasehold.lock.wait_time";
/// Store attempts, summed over acquisitions (by outcome). Divided by the
/// count of [`WAIT_TIME`] of the same outcome it gives the attempts per
/// acquisition; a counter, not a histogram, because an acquisition then
/// costs one histogram sample less (see `docs/metrics.md`), and because
/// the Node package exports the same name as a counter.
pub const ATTEMPTS: &str = "leasehold.lock.attempts";
/// Hold time, grant to release (seconds).
pub const USE_TIME: &str = "leasehold.lock.use_time";
/// Renewals by outcome.
pub const RENEWALS: &str = "leasehold.lock.renewals";
/// Lost leases by reason.
pub const LOST: &str = "leasehold.lock.lost";
/// Store errors by type and operation.
pub const STORE_ERRORS: &str = "leasehold.store.errors";
/// Acquisitions waiting now.
pub const PENDING: &str = "leasehold.lock.pending_requests";
/// Leases held now.
pub const HELD: &str = "leasehold.lock.held";

/// Gives every metric its unit and help text in the installed recorder.
/// Call it once after installing the recorder; harmless without one.
pub fn describe() {
    describe_histogram!(
        WAIT_TIME,
        Unit::Seconds,
        "Time from an acquire call to its end, by outcome"
    );
    describe_counter!(
        ATTEMPTS,
        Unit::Count,
        "Attempts at the store, summed over acquire calls"
    );
    describe_histogram!(
        USE_TIME,
        Unit::Seconds,
        "Time a lease was held, from its grant to its release"
    );
    describe_counter!(RENEWALS, Unit::Count, "Lease renewals by outcome");
    describe_counter!(LOST, Unit::Count, "Leases lost by reason");
    describe_counter!(STORE_ERRORS, Unit::Count, "Errors from the store");
    describe_gauge!(PENDING, Unit::Count, "Acquire calls waiting now");
    describe_gauge!(HELD, Unit::Count, "Leases held now");
}

/// What the library's metrics are registered with (the macros' default).
static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// Which recorder is in effect: its address and size. Handles resolved
/// through one recorder are kept until another is in effect (a local
/// recorder on this thread, a global one installed later); a recorder is
/// told apart by where it lives, which is enough for any recorder with
/// state (a stateless one records nowhere of its own).
type RecorderId = (usize, usize);

fn recorder_id(recorder: &dyn Recorder) -> RecorderId {
    (
        (recorder as *const dyn Recorder).cast::<()>() as usize,
        std::mem::size_of_val(recorder),
    )
}

/// The metric handles of one series (store, primitive, lock class),
/// resolved once through the recorder in effect: recording an event is
/// then one lookup here and the handle's own update, where the macros
/// would build the label set and ask the recorder for the handle each time
/// (which, for the Prometheus exporter, hashes the key into its registry).
///
/// The handles of the first two recorders the series meets (in an
/// application: the facade's no-op one, if anything was recorded before
/// the application installed its recorder, and that recorder) are read
/// without a lock, one atomic load each; any later one (thread-local
/// recorders in turn, in tests) has its handles behind a lock, the last
/// such recorder's only. A read lock's two atomic read-modify-writes per
/// event showed up in profiles of `memory://` rounds (`docs/metrics.md`).
#[derive(Debug, Default)]
pub(crate) struct Handles {
    lock_free: [OnceLock<Resolved>; 2],
    other: RwLock<Option<Resolved>>,
}

/// Handles resolved through one recorder, each on its first use (so a
/// recorder holds only the series that happened).
#[derive(Debug)]
struct Resolved {
    recorder: RecorderId,
    /// By [`Outcome`] (as an index).
    wait: [OnceLock<Histogram>; 5],
    attempts: [OnceLock<Counter>; 5],
    use_time: OnceLock<Histogram>,
    /// By [`Renewal`].
    renewals: [OnceLock<Counter>; 3],
    /// By [`Lost`].
    lost: [OnceLock<Counter>; 3],
    /// By error type (unavailable, backend) times operation (acquire, renew).
    errors: [OnceLock<Counter>; 4],
    pending: OnceLock<Gauge>,
    held: OnceLock<Gauge>,
}

impl Resolved {
    fn new(recorder: RecorderId) -> Self {
        Resolved {
            recorder,
            wait: Default::default(),
            attempts: Default::default(),
            use_time: OnceLock::new(),
            renewals: Default::default(),
            lost: Default::default(),
            errors: Default::default(),
            pending: OnceLock::new(),
            held: OnceLock::new(),
        }
    }
}

/// One lock's series as the hooks hand it over: its handles and the labels
/// every metric of it carries.
#[derive(Clone, Copy)]
pub(crate) struct SeriesRef<'a> {
    pub handles: &'a Handles,
    pub store: &'a Arc<str>,
    pub primitive: &'static str,
    pub class: &'a Arc<str>,
}

/// Records one event of series `s`: `event` gets the handles resolved
/// through the recorder in effect, and that recorder to resolve a missing
/// one.
fn record(s: SeriesRef<'_>, event: impl FnOnce(&Resolved, &Registrar<'_>)) {
    with_recorder(|recorder| {
        let id = recorder_id(recorder);
        let registrar = Registrar {
            recorder,
            series: s,
        };
        for slot in &s.handles.lock_free {
            let resolved = slot.get_or_init(|| Resolved::new(id));
            if resolved.recorder == id {
                return event(resolved, &registrar);
            }
        }
        other_recorder(s.handles, id, |resolved| event(resolved, &registrar));
    })
}

/// The handles of a recorder after the series' first two, behind a lock
/// (resolved again whenever that recorder changes).
fn other_recorder(handles: &Handles, id: RecorderId, event: impl FnOnce(&Resolved)) {
    {
        let resolved = handles.other.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(resolved) = resolved.as_ref().filter(|r| r.recorder == id) {
            return event(resolved);
        }
    }
    let mut resolved = handles
        .other
        .write()
        .unwrap_or_else(PoisonError::into_inner);
    let resolved = match &mut *resolved {
        Some(r) if r.recorder == id => r,
        slot => slot.insert(Resolved::new(id)),
    };
    event(resolved)
}

/// Registers a series' metric with a recorder (the slow path, once per
/// metric, series and recorder).
struct Registrar<'a> {
    recorder: &'a dyn Recorder,
    series: SeriesRef<'a>,
}

impl Registrar<'_> {
    /// The key of `name` with the labels every metric of the series
    /// carries, then `extra`.
    fn key(&self, name: &'static str, extra: &[(&'static str, &'static str)]) -> Key {
        let series = self.series;
        let mut labels = Vec::with_capacity(3 + extra.len());
        labels.push(Label::new("store", series.store.clone()));
        labels.push(Label::new("primitive", series.primitive));
        labels.push(Label::new("lock_class", series.class.clone()));
        labels.extend(extra.iter().map(|&(k, v)| Label::new(k, v)));
        Key::from_parts(name, labels)
    }

    fn histogram(&self, name: &'static str, extra: &[(&'static str, &'static str)]) -> Histogram {
        self.recorder
            .register_histogram(&self.key(name, extra), &METADATA)
    }

    fn counter(&self, name: &'static str, extra: &[(&'static str, &'static str)]) -> Counter {
        self.recorder
            .register_counter(&self.key(name, extra), &METADATA)
    }

    fn gauge(&self, name: &'static str) -> Gauge {
        self.recorder
            .register_gauge(&self.key(name, &[]), &METADATA)
    }
}

pub(crate) fn acquired(
    s: SeriesRef<'_>,
    outcome: Outcome,
    waited: Duration,
    attempts: u64,
    waits: bool,
) {
    record(s, |h, r| {
        let i = outcome as usize;
        let label = [("outcome", outcome.as_str())];
        h.wait[i]
            .get_or_init(|| r.histogram(WAIT_TIME, &label))
            .record(seconds(waited));
        h.attempts[i]
            .get_or_init(|| r.counter(ATTEMPTS, &label))
            .increment(attempts);
        if waits {
            h.pending.get_or_init(|| r.gauge(PENDING)).decrement(1.0);
        }
    });
}

pub(crate) fn waiting(s: SeriesRef<'_>, delta: f64) {
    record(s, |h, r| {
        h.pending.get_or_init(|| r.gauge(PENDING)).increment(delta)
    });
}

pub(crate) fn held(s: SeriesRef<'_>, delta: f64) {
    record(s, |h, r| {
        h.held.get_or_init(|| r.gauge(HELD)).increment(delta)
    });
}

pub(crate) fn released(s: SeriesRef<'_>, held_for: Duration) {
    record(s, |h, r| {
        h.use_time
            .get_or_init(|| r.histogram(USE_TIME, &[]))
            .record(seconds(held_for));
        h.held.get_or_init(|| r.gauge(HELD)).decrement(1.0);
    });
}

pub(crate) fn renewal(s: SeriesRef<'_>, outcome: Renewal) {
    record(s, |h, r| {
        h.renewals[outcome as usize]
            .get_or_init(|| r.counter(RENEWALS, &[("outcome", outcome.as_str())]))
            .increment(1)
    });
}

pub(crate) fn lost(s: SeriesRef<'_>, why: Lost) {
    record(s, |h, r| {
        h.lost[why as usize]
            .get_or_init(|| r.counter(LOST, &[("reason", why.as_str())]))
            .increment(1)
    });
}

pub(crate) fn store_error(s: SeriesRef<'_>, kind: &'static str, operation: &'static str) {
    let labels = [("error_type", kind), ("operation", operation)];
    let slot = match (kind, operation) {
        ("unavailable", "acquire") => Some(0),
        ("unavailable", "renew") => Some(1),
        ("backend", "acquire") => Some(2),
        ("backend", "renew") => Some(3),
        _ => None,
    };
    record(s, |h, r| match slot {
        Some(i) => h.errors[i]
            .get_or_init(|| r.counter(STORE_ERRORS, &labels))
            .increment(1),
        // A pair without a slot: resolved each time.
        None => r.counter(STORE_ERRORS, &labels).increment(1),
    });
}

#[cfg(test)]
mod tests {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    /// The `use_time` count `recorder` holds for lock class `class`.
    fn holds(recorder: &DebuggingRecorder, class: &str) -> usize {
        recorder
            .snapshotter()
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| {
                key.key().name() == super::USE_TIME
                    && key
                        .key()
                        .labels()
                        .any(|l| l.key() == "lock_class" && l.value() == class)
            })
            .map(|(.., value)| match value {
                DebugValue::Histogram(xs) => xs.len(),
                other => panic!("use_time is a histogram, got {other:?}"),
            })
            .sum()
    }

    /// Handles are resolved once per recorder: when another recorder comes
    /// into effect, the same handle's events go to it, not to the handles
    /// resolved through the first one (nor nowhere, as with none at first).
    #[test]
    fn cached_handles_follow_the_recorder_in_effect() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let locks = rt.block_on(crate::Locks::open("memory://")).unwrap();
        let round = || {
            rt.block_on(async {
                let guard = locks.try_acquire("switch:1").await.unwrap();
                guard.release().await.unwrap();
            })
        };
        round(); // no recorder: resolved as no-ops (the first lock-free slot)
        let first = DebuggingRecorder::new(); // the second lock-free slot
        let (second, third) = (DebuggingRecorder::new(), DebuggingRecorder::new()); // locked
        ::metrics::with_local_recorder(&first, round);
        ::metrics::with_local_recorder(&second, || {
            round();
            round();
        });
        ::metrics::with_local_recorder(&first, round);
        ::metrics::with_local_recorder(&third, round);
        ::metrics::with_local_recorder(&second, round);
        round();
        assert_eq!(holds(&first, "switch"), 2);
        assert_eq!(holds(&second, "switch"), 3);
        assert_eq!(holds(&third, "switch"), 1);
    }
}
