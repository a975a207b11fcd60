//! The contended scenario's waiters, task or process alike: each loops
//! acquire-release on one key and notes when each acquisition was called
//! and granted (wall clock, so processes on one host compare), and the
//! summary says how close the grants came to first come, first served.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold::{AcquireOptions, Locks};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// One acquisition of a contended run: called and granted, in µs since
/// the epoch.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Grant {
    pub arrived_us: u64,
    pub granted_us: u64,
}

/// What one waiter did.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct WaiterRun {
    pub grants: Vec<Grant>,
    /// The longest wait, a last one that ran into the deadline included.
    pub longest_wait_us: u64,
}

/// How close a run's grants came to the order the waiters came in.
#[derive(Debug, Clone, Serialize)]
pub struct Order {
    /// Grants that went to a waiter while another one that had called
    /// earlier still waited (and was granted later), out of all grants.
    pub out_of_order: f64,
    pub mean_wait_ms: f64,
    /// What a waiter waits under first come, first served: the mean time
    /// between two grants times the waiters ahead of it (all others).
    pub fifo_wait_ms: f64,
    /// The longest wait divided by `fifo_wait_ms` (target ≤ 1.5).
    pub longest_per_fifo: f64,
    /// The 99th percentile of the granted waits divided by `fifo_wait_ms`:
    /// what the queue does, where the longest wait alone is one stall of
    /// the machine (a process not scheduled for a few ms) when the FIFO
    /// wait is a fraction of a millisecond.
    pub p99_per_fifo: f64,
    /// Waiters woken by news from the store, per release (per grant).
    pub wakeups_per_release: f64,
    /// Acquire requests sent to the store per grant (the granted one
    /// included): a waiter's busy answers and retries.
    pub attempts_per_grant: f64,
    /// Grants the store handed over to the head of the key's queue.
    pub handed_over: u64,
}

/// What the waiters' `Locks` counted over a run (`Locks::stats`, after
/// less before).
#[derive(Debug, Default, Clone, Copy, Serialize, Deserialize)]
pub struct Counted {
    pub attempts: u64,
    pub wakeups: u64,
    pub handed_over: u64,
}

impl Counted {
    pub fn between(before: &leasehold::Stats, after: &leasehold::Stats) -> Self {
        Counted {
            attempts: after.attempts - before.attempts,
            wakeups: after.wakeups - before.wakeups,
            handed_over: after.handed_over - before.handed_over,
        }
    }

    /// The sum of two processes' counts.
    pub fn add(self, other: Counted) -> Self {
        Counted {
            attempts: self.attempts + other.attempts,
            wakeups: self.wakeups + other.wakeups,
            handed_over: self.handed_over + other.handed_over,
        }
    }
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Acquires and releases `key` until `deadline`, queueing at the store or
/// not as `fair` says.
pub async fn wait_in_turn(
    locks: &Locks,
    key: &str,
    deadline: Instant,
    fair: bool,
) -> leasehold::Result<WaiterRun> {
    let mut run = WaiterRun::default();
    while Instant::now() < deadline {
        let t = Instant::now();
        let arrived_us = now_us();
        let opts = AcquireOptions::new()
            .with_wait(deadline.saturating_duration_since(t))
            .with_fair(fair);
        let guard = match locks.acquire_with(key, &opts).await {
            Ok(g) => g,
            Err(leasehold::Error::Timeout { .. }) => {
                // A waiter starved until the end still waited.
                run.longest_wait_us = run.longest_wait_us.max(t.elapsed().as_micros() as u64);
                break;
            }
            Err(e) => return Err(e),
        };
        run.longest_wait_us = run.longest_wait_us.max(t.elapsed().as_micros() as u64);
        run.grants.push(Grant {
            arrived_us,
            granted_us: now_us(),
        });
        guard.release().await?;
    }
    Ok(run)
}

/// Summarizes the grants of `waiters` waiters over a run of `duration`,
/// with what their `Locks` `counted`.
pub fn order(
    mut grants: Vec<Grant>,
    waiters: usize,
    duration: Duration,
    longest: Duration,
    counted: Counted,
) -> Order {
    grants.sort_by_key(|g| g.granted_us);
    // A grant is out of order if a later grant went to a waiter that had
    // called before it: the smallest arrival among the later grants.
    let mut earliest_later = u64::MAX;
    let mut out_of_order = 0usize;
    for g in grants.iter().rev() {
        if earliest_later < g.arrived_us {
            out_of_order += 1;
        }
        earliest_later = earliest_later.min(g.arrived_us);
    }
    let n = grants.len().max(1) as f64;
    let mut waits: Vec<u64> = grants
        .iter()
        .map(|g| g.granted_us.saturating_sub(g.arrived_us))
        .collect();
    let mean_wait_us = waits.iter().sum::<u64>() as f64 / n;
    waits.sort_unstable();
    let p99_wait_us = waits
        .get(((waits.len().saturating_sub(1)) as f64 * 0.99).round() as usize)
        .copied()
        .unwrap_or(0) as f64;
    let interval_us = duration.as_secs_f64() * 1e6 / n;
    let fifo_wait_us = interval_us * waiters.saturating_sub(1).max(1) as f64;
    Order {
        out_of_order: out_of_order as f64 / n,
        mean_wait_ms: mean_wait_us / 1e3,
        fifo_wait_ms: fifo_wait_us / 1e3,
        longest_per_fifo: longest.as_secs_f64() * 1e6 / fifo_wait_us,
        p99_per_fifo: p99_wait_us / fifo_wait_us,
        wakeups_per_release: counted.wakeups as f64 / n,
        attempts_per_grant: counted.attempts as f64 / n,
        handed_over: counted.handed_over,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(arrived_us: u64, granted_us: u64) -> Grant {
        Grant {
            arrived_us,
            granted_us,
        }
    }

    #[test]
    fn a_grant_ahead_of_an_earlier_waiter_is_out_of_order() {
        let fifo = vec![g(0, 10), g(1, 20), g(2, 30)];
        let counted = Counted {
            attempts: 6,
            wakeups: 3,
            handed_over: 0,
        };
        let o = order(fifo, 3, Duration::from_micros(30), Duration::ZERO, counted);
        assert_eq!(o.out_of_order, 0.0);
        assert_eq!(o.wakeups_per_release, 1.0);
        assert_eq!(o.attempts_per_grant, 2.0);
        // Waits of 10, 19 and 28 µs; a FIFO wait is two grants of 10 µs.
        assert!((o.p99_per_fifo - 1.4).abs() < 1e-9, "{}", o.p99_per_fifo);
        // The waiter that came at 2 went before the one that came at 1.
        let jumped = vec![g(0, 10), g(2, 20), g(1, 30)];
        let o = order(
            jumped,
            3,
            Duration::from_micros(30),
            Duration::ZERO,
            Counted::default(),
        );
        assert!((o.out_of_order - 1.0 / 3.0).abs() < 1e-9);
    }
}
