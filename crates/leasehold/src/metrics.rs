//! Counters, histograms and gauges through the [`metrics`](::metrics)
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
//! | `leasehold.lock.attempts` | histogram | {attempt} | store, primitive, lock_class, outcome |
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

use std::time::Duration;

use ::metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Unit,
};

use crate::observe::{Lost, Outcome, Renewal, Tally};

/// Durations as the facade records them: seconds, as OpenTelemetry's
/// duration metrics are.
fn seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// Acquisition wait, by outcome (seconds).
pub const WAIT_TIME: &str = "leasehold.lock.wait_time";
/// Store attempts per acquisition.
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
    describe_histogram!(
        ATTEMPTS,
        Unit::Count,
        "Attempts at the store per acquire call"
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

/// The labels every metric of `tally`'s lock carries, then `extra`.
macro_rules! labels {
    ($tally:expr $(, $k:literal => $v:expr)*) => {{
        let t: &Tally = $tally;
        let l = t.labels();
        vec![
            ::metrics::Label::new("store", t.store().clone()),
            ::metrics::Label::new("primitive", l.primitive.as_str()),
            ::metrics::Label::new("lock_class", l.class.clone()),
            $(::metrics::Label::new($k, $v),)*
        ]
    }};
}

pub(crate) fn acquired(
    tally: &Tally,
    outcome: Outcome,
    waited: Duration,
    attempts: u64,
    waits: bool,
) {
    let labels = labels!(tally, "outcome" => outcome.as_str());
    histogram!(WAIT_TIME, labels.clone()).record(seconds(waited));
    histogram!(ATTEMPTS, labels).record(attempts as f64);
    if waits {
        waiting(tally, -1.0);
    }
}

pub(crate) fn waiting(tally: &Tally, delta: f64) {
    gauge!(PENDING, labels!(tally)).increment(delta);
}

pub(crate) fn held(tally: &Tally, delta: f64) {
    gauge!(HELD, labels!(tally)).increment(delta);
}

pub(crate) fn released(tally: &Tally, held_for: Duration) {
    let labels = labels!(tally);
    histogram!(USE_TIME, labels.clone()).record(seconds(held_for));
    gauge!(HELD, labels).decrement(1.0);
}

pub(crate) fn renewal(tally: &Tally, outcome: Renewal) {
    counter!(RENEWALS, labels!(tally, "outcome" => outcome.as_str())).increment(1);
}

pub(crate) fn lost(tally: &Tally, why: Lost) {
    counter!(LOST, labels!(tally, "reason" => why.as_str())).increment(1);
}

pub(crate) fn store_error(tally: &Tally, kind: &'static str, operation: &'static str) {
    counter!(
        STORE_ERRORS,
        labels!(tally, "error_type" => kind, "operation" => operation)
    )
    .increment(1);
}
