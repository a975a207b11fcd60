//! `locks.stats()`: the Rust handle's [`leasehold::Stats`] as a plain JS
//! object (counts since open, wait and hold quantiles in milliseconds).
//! Separate from the acquire path in `locks.rs`: reading it touches only
//! the handle's counters, never the store.

use napi_derive::napi;

use crate::locks::NativeLocks;

/// How acquisitions ended.
#[napi(object, object_from_js = false)]
pub struct AcquireCounts {
    pub granted: f64,
    pub busy: f64,
    pub timeout: f64,
    pub cancelled: f64,
    pub failed: f64,
}

/// Renewals by outcome.
#[napi(object, object_from_js = false)]
pub struct RenewalCounts {
    pub ok: f64,
    pub failed: f64,
    pub unknown: f64,
}

/// Lost leases by reason.
#[napi(object, object_from_js = false)]
pub struct LostCounts {
    pub expired: f64,
    pub gone: f64,
    pub error: f64,
}

/// Quantiles of a duration distribution, in milliseconds.
#[napi(object, object_from_js = false)]
pub struct Quantiles {
    pub count: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// A snapshot of one `Locks` handle.
#[napi(object, object_from_js = false)]
pub struct Stats {
    pub acquires: AcquireCounts,
    pub attempts: f64,
    pub waiting: f64,
    pub held: f64,
    pub renewals: RenewalCounts,
    pub lost: LostCounts,
    pub store_errors: f64,
    pub wait: Quantiles,
    pub hold: Quantiles,
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl From<leasehold::Quantiles> for Quantiles {
    fn from(q: leasehold::Quantiles) -> Self {
        Quantiles {
            count: q.count as f64,
            p50_ms: ms(q.p50),
            p90_ms: ms(q.p90),
            p99_ms: ms(q.p99),
            max_ms: ms(q.max),
        }
    }
}

impl From<leasehold::Stats> for Stats {
    fn from(s: leasehold::Stats) -> Self {
        let a = s.acquires;
        Stats {
            acquires: AcquireCounts {
                granted: a.granted as f64,
                busy: a.busy as f64,
                timeout: a.timeout as f64,
                cancelled: a.cancelled as f64,
                failed: a.failed as f64,
            },
            attempts: s.attempts as f64,
            waiting: s.waiting as f64,
            held: s.held as f64,
            renewals: RenewalCounts {
                ok: s.renewals.ok as f64,
                failed: s.renewals.failed as f64,
                unknown: s.renewals.unknown as f64,
            },
            lost: LostCounts {
                expired: s.lost.expired as f64,
                gone: s.lost.gone as f64,
                error: s.lost.error as f64,
            },
            store_errors: s.store_errors as f64,
            wait: s.wait.into(),
            hold: s.hold.into(),
        }
    }
}

#[napi]
impl NativeLocks {
    /// Counts and quantiles since the handle was opened (no store call).
    #[napi]
    pub fn stats(&self) -> Stats {
        self.locks().stats().into()
    }
}
