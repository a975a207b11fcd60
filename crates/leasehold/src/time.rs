//! Durations and deadlines: ttl bounds, the holder's safety margin, the
//! waiter's backoff, and the clock lease deadlines are measured on.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

use crate::error::{Error, Result};

/// Shortest lease a caller may ask for.
pub const MIN_TTL: Duration = Duration::from_millis(100);
/// Longest lease a caller may ask for.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// Lease length when the caller does not choose one.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// Checks that `ttl` is within [`MIN_TTL`]`..=`[`MAX_TTL`].
///
/// # Errors
/// [`Error::InvalidInput`] saying the allowed range and what was given.
pub fn validate_ttl(ttl: Duration) -> Result<Duration> {
    if ttl < MIN_TTL || ttl > MAX_TTL {
        return Err(Error::invalid(
            "ttl",
            format!("must be between 100ms and 24h, got {ttl:?}"),
        ));
    }
    Ok(ttl)
}

/// How much earlier than `sent_at + ttl` the holder stops trusting its lease:
/// 1 % of the ttl for clock drift plus 2 ms for the store's own processing.
pub fn safety_margin(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// How long a lease can be relied on, measured from the moment its request
/// was sent: `ttl - safety_margin(ttl)`.
pub fn trusted_for(ttl: Duration) -> Duration {
    ttl.saturating_sub(safety_margin(ttl))
}

/// When the holder renews: a third of the ttl after the last good renewal,
/// so two renewals can fail before the lease runs out.
pub fn renew_interval(ttl: Duration) -> Duration {
    ttl / 3
}

/// Jittered, growing sleep between attempts of a waiter whose wake-up
/// notification has not arrived.
///
/// Attempt 0 sleeps about `base`; each later one doubles up to `cap`. The
/// actual sleep is uniform in `[d/2, d]` ("equal jitter") so that waiters
/// that started together spread out.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    attempt: u32,
}

impl Backoff {
    /// A backoff starting at `base` and never above `cap`.
    pub fn new(base: Duration, cap: Duration) -> Self {
        Backoff {
            base,
            cap: cap.max(base),
            attempt: 0,
        }
    }

    /// The next sleep.
    pub fn next_delay(&mut self) -> Duration {
        let exp = self.attempt.min(20);
        self.attempt = self.attempt.saturating_add(1);
        let full = self.base.saturating_mul(1 << exp).min(self.cap);
        let half = full / 2;
        let jitter = rand::thread_rng().gen_range(0..=half.as_micros() as u64);
        half + Duration::from_micros(jitter)
    }
}

/// How often a sleep towards a lease deadline looks at the suspend clock
/// again: after the machine resumes, a holder notices at most this late.
pub(crate) const SUSPEND_CHECK_EVERY: Duration = Duration::from_secs(1);

/// How long the machine has been suspended (or its VM frozen) since this
/// clock was made. Never decreases.
///
/// The seam between lease deadlines and the operating system, so tests can
/// suspend the machine by hand.
pub(crate) trait SuspendClock: Send + Sync + fmt::Debug {
    /// Total suspended time so far.
    fn suspended(&self) -> Duration;
}

/// The real suspend clock: on Linux, how far `CLOCK_BOOTTIME` (which keeps
/// counting in suspend) has run ahead of `CLOCK_MONOTONIC` (which does not,
/// and which both `std` and tokio instants read). Elsewhere suspension is not
/// detected and this stays at zero.
#[derive(Debug)]
struct SystemSuspendClock {
    boot_at_start: Duration,
    mono_at_start: std::time::Instant,
    /// Largest value reported so far, in ns: two clock reads are not one
    /// instant, and the answer must never go backwards.
    highest_ns: AtomicU64,
}

impl SystemSuspendClock {
    fn new() -> Self {
        // Monotonic first, so the baseline gap is never positive either.
        let mono_at_start = std::time::Instant::now();
        SystemSuspendClock {
            boot_at_start: boot_time(),
            mono_at_start,
            highest_ns: AtomicU64::new(0),
        }
    }
}

impl SuspendClock for SystemSuspendClock {
    fn suspended(&self) -> Duration {
        // Boot clock first: a delay between the two reads (preemption) then
        // shrinks the gap instead of passing for a suspend.
        let boot = boot_time().saturating_sub(self.boot_at_start);
        let mono = self.mono_at_start.elapsed();
        let gap = u64::try_from(boot.saturating_sub(mono).as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(self.highest_ns.fetch_max(gap, Ordering::Relaxed).max(gap))
    }
}

/// Time since boot, counting suspended time.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub(crate) fn boot_time() -> Duration {
    use nix::time::{clock_gettime, ClockId};
    // CLOCK_BOOTTIME exists since Linux 2.6.39; if it failed anyway, the
    // constant makes suspension undetected rather than wrong.
    clock_gettime(ClockId::CLOCK_BOOTTIME).map_or(Duration::ZERO, Duration::from)
}

/// Without a boot clock, the monotonic clock itself: suspension is not seen.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub(crate) fn boot_time() -> Duration {
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed()
}

/// The clock lease deadlines (`valid_until`, the renewal schedule, the
/// lost-lease signal) are measured on: tokio's monotonic clock plus the time
/// the machine spent suspended, so a holder that resumes after a suspend
/// sees its deadline as passed, as the store does.
///
/// Its instants are tokio [`Instant`]s shifted forward by the suspended
/// time; [`LeaseClock::to_local`] converts one back for callers.
#[derive(Clone, Debug)]
pub(crate) struct LeaseClock {
    suspend: Arc<dyn SuspendClock>,
}

impl Default for LeaseClock {
    fn default() -> Self {
        static SYSTEM: OnceLock<Arc<SystemSuspendClock>> = OnceLock::new();
        LeaseClock {
            suspend: SYSTEM
                .get_or_init(|| Arc::new(SystemSuspendClock::new()))
                .clone(),
        }
    }
}

impl LeaseClock {
    /// A lease clock over another suspend clock (tests).
    #[cfg(test)]
    pub(crate) fn with_suspend_clock(suspend: Arc<dyn SuspendClock>) -> Self {
        LeaseClock { suspend }
    }

    /// Total suspended time so far.
    pub(crate) fn suspended(&self) -> Duration {
        self.suspend.suspended()
    }

    /// Now, on the lease clock.
    pub(crate) fn now(&self) -> Instant {
        Instant::now() + self.suspended()
    }

    /// The tokio instant that corresponds to lease-clock instant `at` now
    /// (earlier by the time suspended so far).
    pub(crate) fn to_local(&self, at: Instant) -> Instant {
        at.checked_sub(self.suspended())
            .unwrap_or_else(Instant::now)
    }

    /// Sleeps until `deadline` on the lease clock. A suspend during the
    /// sleep ends it within [`SUSPEND_CHECK_EVERY`] of the resume, rather
    /// than a whole monotonic interval later.
    pub(crate) async fn sleep_until(&self, deadline: Instant) {
        loop {
            let now = self.now();
            if now >= deadline {
                return;
            }
            tokio::time::sleep((deadline - now).min(SUSPEND_CHECK_EVERY)).await;
        }
    }
}

/// A suspend clock moved by hand.
#[cfg(test)]
#[derive(Debug, Default)]
pub(crate) struct ManualSuspendClock {
    suspended_ns: AtomicU64,
}

#[cfg(test)]
impl ManualSuspendClock {
    /// Pretends the machine was just suspended for `d`.
    pub(crate) fn suspend_for(&self, d: Duration) {
        self.suspended_ns
            .fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
impl SuspendClock for ManualSuspendClock {
    fn suspended(&self) -> Duration {
        Duration::from_nanos(self.suspended_ns.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_bounds() {
        assert!(validate_ttl(Duration::from_millis(100)).is_ok());
        assert!(validate_ttl(Duration::from_secs(86_400)).is_ok());
        let e = validate_ttl(Duration::ZERO).unwrap_err().to_string();
        assert_eq!(e, "invalid ttl: must be between 100ms and 24h, got 0ns");
        assert!(validate_ttl(Duration::from_millis(99)).is_err());
        assert!(validate_ttl(Duration::from_secs(86_401)).is_err());
    }

    #[test]
    fn margin_follows_the_protocol() {
        assert_eq!(
            safety_margin(Duration::from_secs(30)),
            Duration::from_millis(302)
        );
        assert_eq!(
            trusted_for(Duration::from_secs(1)),
            Duration::from_millis(988)
        );
        assert_eq!(
            renew_interval(Duration::from_secs(30)),
            Duration::from_secs(10)
        );
    }

    #[test]
    fn backoff_grows_within_jitter_and_cap() {
        let mut b = Backoff::new(Duration::from_millis(10), Duration::from_millis(80));
        let expected_full = [10u64, 20, 40, 80, 80, 80];
        for full in expected_full {
            let d = b.next_delay();
            let full = Duration::from_millis(full);
            assert!(
                d >= full / 2 && d <= full,
                "{d:?} outside [{:?}, {full:?}]",
                full / 2
            );
        }
    }

    #[test]
    fn the_system_clock_sees_no_suspension_while_running() {
        let clock = LeaseClock::default();
        let first = clock.suspended();
        std::thread::sleep(Duration::from_millis(20));
        let second = clock.suspended();
        assert!(second >= first, "never goes backwards");
        // Reading two clocks is not atomic; anything past a millisecond
        // would be a real suspension, which a test run does not have.
        assert!(second < Duration::from_millis(1), "{second:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_suspend_ends_a_lease_clock_sleep_at_the_next_check() {
        let manual = Arc::new(ManualSuspendClock::default());
        let clock = LeaseClock::with_suspend_clock(manual.clone());
        let deadline = clock.now() + Duration::from_secs(30);
        let sleeper = tokio::spawn({
            let clock = clock.clone();
            async move { clock.sleep_until(deadline).await }
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!sleeper.is_finished());
        manual.suspend_for(Duration::from_secs(60));
        assert!(
            clock.to_local(deadline) <= Instant::now(),
            "the deadline has passed"
        );
        tokio::time::timeout(SUSPEND_CHECK_EVERY + Duration::from_millis(10), sleeper)
            .await
            .expect("the sleep ends within one check after the resume")
            .unwrap();
    }

    /// A guard with a 30 s ttl, 2 s into its lease, on a lease clock whose
    /// suspensions the test makes.
    async fn held_on_a_manual_clock() -> (Arc<ManualSuspendClock>, crate::LeaseGuard) {
        let manual = Arc::new(ManualSuspendClock::default());
        // Renewal on the paused test runtime, whose clock the test moves.
        let locks = crate::Locks::new(crate::backends::memory::MemoryBackend::new())
            .with_background_runtime(tokio::runtime::Handle::current())
            .with_lease_clock(LeaseClock::with_suspend_clock(manual.clone()));
        let ttl = Duration::from_secs(30);
        let guard = locks
            .acquire_with("k", &crate::AcquireOptions::new().with_ttl(ttl))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        (manual, guard)
    }

    /// A holder whose machine slept through its lease sees the loss at
    /// once (`is_lost`) and gets the signal within one check, instead of
    /// trusting the lease for up to a whole ttl of monotonic time.
    #[tokio::test(start_paused = true)]
    async fn a_resumed_holder_sees_its_lease_lost_at_once() {
        let (manual, guard) = held_on_a_manual_clock().await;
        assert!(!guard.is_lost());
        let before = guard.valid_until();

        manual.suspend_for(Duration::from_secs(60));
        assert!(guard.is_lost(), "lost as soon as the machine resumes");
        assert!(guard.check().is_err());
        assert!(
            guard.valid_until() <= Instant::now(),
            "valid_until moved back"
        );
        assert!(guard.valid_until() < before);
        tokio::time::timeout(SUSPEND_CHECK_EVERY * 2, guard.lost())
            .await
            .expect("the lost signal fires within a check of the resume");
    }

    /// A short suspend that leaves time on the lease only brings the
    /// renewal forward: the lease survives.
    #[tokio::test(start_paused = true)]
    async fn a_short_suspend_brings_the_renewal_forward() {
        let (manual, guard) = held_on_a_manual_clock().await;
        let before = guard.valid_until();
        // 12 s asleep: past the renewal time (10 s), within the lease.
        manual.suspend_for(Duration::from_secs(12));
        assert!(!guard.is_lost());
        tokio::time::sleep(SUSPEND_CHECK_EVERY * 3).await;
        assert!(!guard.is_lost());
        assert!(
            guard.valid_until() > before,
            "renewed right after the resume, not 10 s of monotonic time later"
        );
    }
}
