//! The client's estimate of the server's clock.
//!
//! Expiry must be judged on the server's clock, but portable MongoDB update
//! operators cannot read it (`$$NOW` needs update pipelines, which several
//! wire-compatible servers lack or get wrong). So the client estimates it:
//! `hello` reports the server's `localTime`, which the server read at some
//! instant between sending and receiving. Taking the midpoint of the round
//! trip, the true server time at that midpoint lies within half the round
//! trip (plus the 1 ms truncation of `localTime`) of the estimate.
//!
//! The estimate is anchored to the monotonic clock, so a jump of the client's
//! wall clock between measurements changes nothing; the error bound grows by
//! a drift allowance with the age of the measurement, which is re-taken
//! every [`REMEASURE_AFTER`] and after a connection failure.
//!
//! The monotonic clock stops while the machine is suspended (or its VM
//! frozen) and the server's does not, so after a suspend the estimate would
//! lag by the time slept: a suspend since the measurement (seen on the
//! [`LeaseClock`]) forces a re-measurement too.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};
use crate::time::LeaseClock;
use mongodb::bson::{doc, Bson};
use mongodb::Database;

/// How old a measurement may get before the next operation re-takes it.
pub(super) const REMEASURE_AFTER: Duration = Duration::from_secs(10);
/// Allowed rate difference between the client's monotonic clock and the
/// server's clock, in parts per million: NTP slews at most 500 ppm.
const DRIFT_PPM: i64 = 500;
/// `hello` round trips per measurement; the shortest one gives the tightest bound.
const SAMPLES: usize = 3;
/// A suspended-time increase below this is the noise of reading two clocks,
/// not a suspend (a real one lasts far longer).
const SUSPEND_NOISE: Duration = Duration::from_millis(1);

/// Bounds on the server's clock now, in milliseconds since the Unix epoch:
/// the true server time is in `lower..=upper`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ServerNow {
    pub lower: i64,
    pub upper: i64,
}

/// One measurement: the server's time (µs since the epoch) at `anchor`.
#[derive(Debug, Clone, Copy)]
struct Sample {
    anchor: Instant,
    server_us: i64,
    error_us: i64,
    /// Server clock minus client wall clock, for diagnostics.
    offset_us: i64,
}

/// The measured offset to the server's clock, for diagnostics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockEstimate {
    /// Server clock minus this client's wall clock, in milliseconds.
    pub offset_ms: i64,
    /// How far the estimate of the server's clock may be off right now.
    pub error_bound: Duration,
}

/// The server-clock estimate shared by every operation of one backend.
#[derive(Debug)]
pub(super) struct ServerClock {
    sample: Mutex<Sample>,
    /// Serializes re-measurements so concurrent operations wait for one.
    measuring: tokio::sync::Mutex<()>,
    stale: AtomicBool,
    /// Added to the client's wall clock: simulates a wrong client clock.
    skew_us: i64,
    /// Tells how long the machine was suspended; see the module docs.
    lease_clock: LeaseClock,
    /// The suspended total when the current sample was taken.
    suspended_at_sample: Mutex<Duration>,
}

impl ServerClock {
    /// Measures the server's clock for the first time.
    pub(super) async fn measure(db: &Database, skew_us: i64) -> Result<Self> {
        let lease_clock = LeaseClock::default();
        let suspended = lease_clock.suspended();
        let sample = take_sample(db, skew_us).await?;
        Ok(Self::from_sample(sample, skew_us, lease_clock, suspended))
    }

    fn from_sample(
        sample: Sample,
        skew_us: i64,
        lease_clock: LeaseClock,
        suspended: Duration,
    ) -> Self {
        ServerClock {
            sample: Mutex::new(sample),
            measuring: tokio::sync::Mutex::new(()),
            stale: AtomicBool::new(false),
            skew_us,
            lease_clock,
            suspended_at_sample: Mutex::new(suspended),
        }
    }

    /// Bounds on the server's clock now, re-measuring first if the last
    /// measurement is old or a connection failed since.
    pub(super) async fn now(&self, db: &Database) -> Result<ServerNow> {
        if self.needs_measuring() {
            let _one_at_a_time = self.measuring.lock().await;
            if self.needs_measuring() {
                // Read first: a suspend during the measurement then still
                // counts as one after it.
                let suspended = self.lease_clock.suspended();
                let sample = take_sample(db, self.skew_us).await?;
                *self.lock() = sample;
                *self
                    .suspended_at_sample
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = suspended;
                self.stale.store(false, Ordering::Release);
            }
        }
        Ok(bounds(&self.lock(), Instant::now()))
    }

    /// Forces a re-measurement before the next operation (the connection
    /// may have gone to another server, or the server restarted).
    pub(super) fn mark_stale(&self) {
        self.stale.store(true, Ordering::Release);
    }

    pub(super) fn estimate(&self) -> ClockEstimate {
        let sample = *self.lock();
        let b = bounds(&sample, Instant::now());
        ClockEstimate {
            offset_ms: sample.offset_us.div_euclid(1000),
            error_bound: Duration::from_millis(((b.upper - b.lower) / 2) as u64),
        }
    }

    fn needs_measuring(&self) -> bool {
        self.stale.load(Ordering::Acquire)
            || self.lock().anchor.elapsed() >= REMEASURE_AFTER
            || self.suspended_since_sample()
    }

    /// Whether the machine was suspended since the sample was taken (by
    /// more than the noise of reading two clocks).
    fn suspended_since_sample(&self) -> bool {
        let at_sample = *self
            .suspended_at_sample
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        self.lease_clock.suspended() > at_sample + SUSPEND_NOISE
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sample> {
        // A sample is replaced whole, so a poisoned lock still holds a valid one.
        self.sample.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Bounds at `now` from `sample`, rounded outwards to whole milliseconds
/// (BSON dates have millisecond precision).
fn bounds(sample: &Sample, now: Instant) -> ServerNow {
    let age_us = i64::try_from(now.saturating_duration_since(sample.anchor).as_micros())
        .unwrap_or(i64::MAX / 4);
    let server_us = sample.server_us + age_us;
    let error_us = sample.error_us + age_us * DRIFT_PPM / 1_000_000;
    ServerNow {
        lower: (server_us - error_us).div_euclid(1000),
        upper: (server_us + error_us + 999).div_euclid(1000),
    }
}

fn client_wall_us(skew_us: i64) -> i64 {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    i64::try_from(since_epoch.as_micros()).unwrap_or(i64::MAX / 4) + skew_us
}

async fn take_sample(db: &Database, skew_us: i64) -> Result<Sample> {
    let mut best: Option<Sample> = None;
    for _ in 0..SAMPLES {
        let wall_before = client_wall_us(skew_us);
        let sent = Instant::now();
        let reply = db
            .run_command(doc! { "hello": 1 })
            .await
            .map_err(super::classify)?;
        let rtt = sent.elapsed();
        let local_ms = match reply.get("localTime") {
            Some(Bson::DateTime(t)) => t.timestamp_millis(),
            _ => {
                let e = Error::backend(
                    "the server's hello reply has no localTime; leasehold cannot judge expiry on its clock",
                );
                return Err(e.in_store(super::errors::STORE));
            }
        };
        let half_rtt_us = i64::try_from(rtt.as_micros() / 2).unwrap_or(i64::MAX / 4);
        // localTime is truncated to the millisecond: the server read a time
        // in [local_ms, local_ms + 1 ms), so its midpoint is 500 µs later.
        let server_us = local_ms * 1000 + 500;
        let sample = Sample {
            anchor: sent + rtt / 2,
            server_us,
            error_us: half_rtt_us + 500,
            offset_us: server_us - (wall_before + half_rtt_us),
        };
        if best.is_none_or(|b| sample.error_us < b.error_us) {
            best = Some(sample);
        }
    }
    best.ok_or_else(|| Error::backend("no clock sample taken").in_store(super::errors::STORE))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::ManualSuspendClock;
    use std::sync::Arc;

    /// After a suspend, the estimate (anchored to the monotonic clock, which
    /// stopped) lags the server by the time slept: it must be re-taken
    /// before the next operation, however young the sample is.
    #[test]
    fn a_suspend_forces_a_new_measurement() {
        let manual = Arc::new(ManualSuspendClock::default());
        let sample = Sample {
            anchor: Instant::now(),
            server_us: 1_000_000_500,
            error_us: 1_000,
            offset_us: 0,
        };
        let clock = ServerClock::from_sample(
            sample,
            0,
            LeaseClock::with_suspend_clock(manual.clone()),
            Duration::ZERO,
        );
        assert!(!clock.needs_measuring(), "a fresh sample is trusted");
        manual.suspend_for(Duration::from_secs(30));
        assert!(clock.needs_measuring(), "a suspend since the sample");
    }

    #[test]
    fn bounds_round_outwards_and_widen_with_age() {
        let anchor = Instant::now();
        let s = Sample {
            anchor,
            server_us: 1_000_000_500,
            error_us: 1_000,
            offset_us: 0,
        };
        assert_eq!(
            bounds(&s, anchor),
            ServerNow {
                lower: 999_999,
                upper: 1_000_002
            }
        );
        // After 10 s: +10 s, and the bound grows by 500 ppm = 5 ms.
        let later = bounds(&s, anchor + Duration::from_secs(10));
        assert_eq!(later.lower, 1_009_994);
        assert_eq!(later.upper, 1_010_007);
    }
}
