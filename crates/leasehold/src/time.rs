//! Durations and deadlines: ttl bounds, the holder's safety margin, and the
//! waiter's backoff.

use std::time::Duration;

use rand::Rng;

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
}
