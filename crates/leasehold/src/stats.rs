//! [`Locks::stats`](crate::Locks::stats): counts and quantiles since the
//! handle was opened, kept without any recorder (as bb8's `Statistics` or
//! deadpool's `Status`).
//!
//! Everything here is a relaxed atomic: a snapshot is cheap and never blocks
//! an acquisition, and its fields may be off by the events in flight while
//! it was taken.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// A snapshot of one [`Locks`](crate::Locks) handle (and its clones): what
/// its acquisitions, guards and renewals did since it was opened.
///
/// ```
/// use std::time::Duration;
/// use leasehold::Locks;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
/// let locks = Locks::open("memory://").await?;
/// let guard = locks.acquire("report:nightly", Duration::from_secs(1)).await?;
/// assert!(locks.try_acquire("report:nightly").await.is_err()); // busy
///
/// let stats = locks.stats();
/// assert_eq!(stats.acquires.granted, 1);
/// assert_eq!(stats.acquires.busy, 1);
/// assert_eq!(stats.held, 1);
/// println!("p99 wait {:?} over {} acquisitions", stats.wait.p99, stats.wait.count);
///
/// guard.release().await?;
/// assert_eq!(locks.stats().held, 0);
/// assert_eq!(locks.stats().hold.count, 1);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Acquisitions by how they ended.
    pub acquires: AcquireCounts,
    /// Attempts at the store, over all acquisitions (a waiter makes several).
    pub attempts: u64,
    /// Times a waiter woke on news from the store (a release notification,
    /// or a grant handed over to it), not on a timer: with queues at the
    /// store (docs/fairness.md) one per release, else one per waiter of
    /// the releasing key in each process.
    pub wakeups: u64,
    /// Acquisitions granted by a hand-off: the store gave the key to this
    /// waiter, the head of its queue, at a release (counted in
    /// `acquires.granted` too).
    pub handed_over: u64,
    /// Acquisitions waiting right now (with a wait bound, not yet ended).
    pub waiting: u64,
    /// Guards alive right now (a lost guard counts until it is dropped).
    pub held: u64,
    /// Renewals of held leases by outcome.
    pub renewals: RenewalCounts,
    /// Leases lost by reason.
    pub lost: LostCounts,
    /// Errors from the store, in acquisitions and renewals.
    pub store_errors: u64,
    /// Time from the call to its end, over every ended acquisition.
    pub wait: Quantiles,
    /// Time from the grant to the guard's release or drop.
    pub hold: Quantiles,
}

/// How acquisitions ended ([`Stats::acquires`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AcquireCounts {
    /// A guard was returned.
    pub granted: u64,
    /// [`Error::Busy`](crate::Error::Busy): tried once, somebody held it.
    pub busy: u64,
    /// [`Error::Timeout`](crate::Error::Timeout): the wait bound passed.
    pub timeout: u64,
    /// [`Error::Cancelled`](crate::Error::Cancelled), or the caller dropped
    /// the call before it ended.
    pub cancelled: u64,
    /// Any other error (the store's, invalid input).
    pub failed: u64,
}

/// Renewals by outcome ([`Stats::renewals`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RenewalCounts {
    /// The store extended the lease.
    pub ok: u64,
    /// The store said no (the lease expired or was taken) or failed.
    pub failed: u64,
    /// No answer in time: the lease may or may not have been extended.
    pub unknown: u64,
}

/// Lost leases by reason ([`Stats::lost`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LostCounts {
    /// The local deadline passed without a successful renewal (or renewal
    /// was off and the ttl ran out).
    pub expired: u64,
    /// The store reported the lease gone: expired there, or force-released
    /// and perhaps taken by another holder.
    pub gone: u64,
    /// Renewal failed with a permanent store error.
    pub error: u64,
}

/// A few quantiles of a duration distribution ([`Stats::wait`],
/// [`Stats::hold`]). Quantiles come from log-scaled buckets: each is the
/// upper bound of its bucket, within 12.5 % above the true value, exact
/// for `max`. All zero while `count` is 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Quantiles {
    /// How many durations were recorded.
    pub count: u64,
    /// The median.
    pub p50: Duration,
    /// The 90th percentile.
    pub p90: Duration,
    /// The 99th percentile.
    pub p99: Duration,
    /// The longest.
    pub max: Duration,
}

/// Buckets per power of two: 8 keeps a bucket's bound within 12.5 %.
const SUB: u32 = 8;
/// Powers of two of microseconds covered: 2^40 µs is about 12 days.
const OCTAVES: u32 = 40;
const BUCKETS: usize = (SUB * OCTAVES) as usize + 1;

/// A log-scaled histogram of microseconds, lock-free.
pub(crate) struct Histogram {
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    max_micros: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            max_micros: AtomicU64::new(0),
        }
    }
}

/// The bucket of `micros`: linear below `SUB`, then `SUB` per octave.
fn bucket_of(micros: u64) -> usize {
    if micros < u64::from(SUB) {
        return micros as usize;
    }
    let octave = 63 - micros.leading_zeros(); // >= 3
    let sub = (micros >> (octave - 3)) & u64::from(SUB - 1);
    let index = (octave - 2) * SUB + sub as u32;
    (index as usize).min(BUCKETS - 1)
}

/// The largest value of bucket `index` (the quantile reported for it,
/// capped by the largest value recorded).
fn upper_bound(index: usize) -> u64 {
    if index >= BUCKETS - 1 {
        return u64::MAX; // the overflow bucket: quantiles are capped by max
    }
    let index = index as u32;
    if index < SUB {
        return u64::from(index);
    }
    let octave = index / SUB + 2;
    let sub = u64::from(index % SUB);
    ((u64::from(SUB) + sub + 1) << (octave - 3)) - 1
}

impl Histogram {
    pub(crate) fn record(&self, d: Duration) {
        let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.buckets[bucket_of(micros)].fetch_add(1, Relaxed);
        self.count.fetch_add(1, Relaxed);
        self.max_micros.fetch_max(micros, Relaxed);
    }

    fn quantiles(&self) -> Quantiles {
        let counts: Vec<u64> = self.buckets.iter().map(|b| b.load(Relaxed)).collect();
        let count: u64 = counts.iter().sum();
        if count == 0 {
            return Quantiles::default();
        }
        let max = self.max_micros.load(Relaxed);
        let at = |q: f64| {
            // The rank of the q-quantile, 1-based, at least 1.
            let rank = ((count as f64 * q).ceil() as u64).max(1);
            let mut seen = 0;
            for (i, c) in counts.iter().enumerate() {
                seen += c;
                if seen >= rank {
                    return Duration::from_micros(upper_bound(i).min(max));
                }
            }
            Duration::from_micros(max)
        };
        Quantiles {
            count,
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            max: Duration::from_micros(max),
        }
    }
}

/// The live counters behind [`Stats`], one per handle (shared by clones).
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) granted: AtomicU64,
    pub(crate) busy: AtomicU64,
    pub(crate) timeout: AtomicU64,
    pub(crate) cancelled: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) attempts: AtomicU64,
    pub(crate) wakeups: AtomicU64,
    pub(crate) handed_over: AtomicU64,
    pub(crate) waiting: AtomicU64,
    pub(crate) held: AtomicU64,
    pub(crate) renew_ok: AtomicU64,
    pub(crate) renew_failed: AtomicU64,
    pub(crate) renew_unknown: AtomicU64,
    pub(crate) lost_expired: AtomicU64,
    pub(crate) lost_gone: AtomicU64,
    pub(crate) lost_error: AtomicU64,
    pub(crate) store_errors: AtomicU64,
    pub(crate) wait: Histogram,
    pub(crate) hold: Histogram,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> Stats {
        let get = |a: &AtomicU64| a.load(Relaxed);
        Stats {
            acquires: AcquireCounts {
                granted: get(&self.granted),
                busy: get(&self.busy),
                timeout: get(&self.timeout),
                cancelled: get(&self.cancelled),
                failed: get(&self.failed),
            },
            attempts: get(&self.attempts),
            wakeups: get(&self.wakeups),
            handed_over: get(&self.handed_over),
            waiting: get(&self.waiting),
            held: get(&self.held),
            renewals: RenewalCounts {
                ok: get(&self.renew_ok),
                failed: get(&self.renew_failed),
                unknown: get(&self.renew_unknown),
            },
            lost: LostCounts {
                expired: get(&self.lost_expired),
                gone: get(&self.lost_gone),
                error: get(&self.lost_error),
            },
            store_errors: get(&self.store_errors),
            wait: self.wait.quantiles(),
            hold: self.hold.quantiles(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_lands_in_a_bucket_whose_bound_is_within_an_eighth_above_it() {
        for micros in (0..5000).chain([1 << 20, (1 << 20) + 12345, u64::MAX / 4]) {
            let b = bucket_of(micros);
            let upper = upper_bound(b);
            assert!(upper >= micros, "{micros} -> bucket {b} bound {upper}");
            if b > 0 && b < BUCKETS - 1 {
                assert!(
                    upper_bound(b - 1) < micros,
                    "{micros} not in the lowest bucket that fits"
                );
                assert!(
                    upper as f64 <= micros as f64 * 1.125 + 1.0,
                    "{micros} -> {upper}"
                );
            }
        }
    }

    #[test]
    fn quantiles_follow_the_recorded_durations() {
        let h = Histogram::default();
        assert_eq!(h.quantiles(), Quantiles::default());
        for ms in 1..=100 {
            h.record(Duration::from_millis(ms));
        }
        let q = h.quantiles();
        assert_eq!(q.count, 100);
        assert_eq!(q.max, Duration::from_millis(100));
        let near = |got: Duration, want_ms: u64| {
            let want = Duration::from_millis(want_ms);
            assert!(
                got >= want && got <= want.mul_f64(1.125),
                "{got:?} vs {want:?}"
            );
        };
        near(q.p50, 50);
        near(q.p90, 90);
        near(q.p99, 99);
    }
}
