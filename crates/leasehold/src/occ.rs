//! Optimistic concurrency control: run a versioned compare-and-swap, and on
//! conflict retry it with bounded, jittered backoff.
//!
//! The store-specific part is yours: read the row and its version, then
//! write `... WHERE id = ? AND version = ?` and report [`Attempt::Conflict`]
//! when it matched 0 rows. The loop, the bound and the backoff live here.
//!
//! ```
//! use std::sync::atomic::{AtomicU32, Ordering};
//! use leasehold::occ::{retry_optimistic, Attempt, RetryPolicy};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let version = AtomicU32::new(0);
//! let done = retry_optimistic(&RetryPolicy::default(), |attempt| {
//!     let seen = version.load(Ordering::SeqCst);
//!     // Pretend another writer wins the first two rounds.
//!     if attempt < 3 { version.fetch_add(1, Ordering::SeqCst); }
//!     let won = version
//!         .compare_exchange(seen, seen + 1, Ordering::SeqCst, Ordering::SeqCst)
//!         .is_ok();
//!     async move { Ok::<_, std::convert::Infallible>(if won { Attempt::Committed(seen + 1) } else { Attempt::Conflict }) }
//! })
//! .await
//! .unwrap();
//! assert_eq!(done.attempts, 3);
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::time::Backoff;

/// What one optimistic attempt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt<T> {
    /// The compare-and-swap matched; the write is done.
    Committed(T),
    /// Somebody else changed the data first; read again and retry.
    Conflict,
}

/// A successful run: the value and how many attempts it took (1 = first try).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed<T> {
    /// What the committing attempt returned.
    pub value: T,
    /// Attempts made, including the committing one.
    pub attempts: u32,
}

/// Why an optimistic run gave up.
#[derive(Debug)]
pub enum RetryError<E> {
    /// Every attempt conflicted.
    Exhausted {
        /// Attempts made.
        attempts: u32,
    },
    /// An attempt failed with an error that is not retried.
    Failed {
        /// The error.
        error: E,
        /// Attempts made, including the failed one.
        attempts: u32,
    },
}

impl<E: fmt::Display> fmt::Display for RetryError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RetryError::Exhausted { attempts } => {
                write!(f, "gave up after {attempts} conflicting attempts")
            }
            RetryError::Failed { error, attempts } => {
                write!(f, "attempt {attempts} failed: {error}")
            }
        }
    }
}

impl<E: fmt::Debug + fmt::Display> std::error::Error for RetryError<E> {}

/// How many times to retry and how long to sleep in between.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    max_attempts: u32,
    base: Duration,
    cap: Duration,
}

impl Default for RetryPolicy {
    /// 10 attempts, backoff from 2 ms doubling up to 100 ms, jittered.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 10,
            base: Duration::from_millis(2),
            cap: Duration::from_millis(100),
        }
    }
}

impl RetryPolicy {
    /// Up to `max_attempts` attempts, sleeping from `base` doubling to `cap`.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] if `max_attempts` is 0 or `base` exceeds `cap`.
    pub fn new(max_attempts: u32, base: Duration, cap: Duration) -> Result<Self> {
        if max_attempts == 0 {
            return Err(Error::invalid("max_attempts", "must be at least 1, got 0"));
        }
        if base > cap {
            return Err(Error::invalid(
                "backoff",
                format!("base {base:?} must not exceed cap {cap:?}"),
            ));
        }
        Ok(RetryPolicy {
            max_attempts,
            base,
            cap,
        })
    }

    /// The attempt bound.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The sleeps between attempts, for retry loops of store helpers.
    pub(crate) fn backoff(&self) -> Backoff {
        Backoff::new(self.base, self.cap)
    }
}

/// Runs `attempt(n)` for n = 1, 2, ... until it commits, retrying conflicts
/// with jittered backoff up to the policy's bound. Errors are not retried.
///
/// # Errors
/// [`RetryError::Exhausted`] when every attempt conflicted;
/// [`RetryError::Failed`] with the first error an attempt returned.
pub async fn retry_optimistic<T, E, F, Fut>(
    policy: &RetryPolicy,
    attempt: F,
) -> std::result::Result<Committed<T>, RetryError<E>>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = std::result::Result<Attempt<T>, E>>,
{
    retry_optimistic_with(policy, |_: &E| false, attempt).await
}

/// As [`retry_optimistic`], but also retries errors for which
/// `is_transient` says yes (a serialization failure, a deadlock victim, a
/// dropped connection).
///
/// # Errors
/// As [`retry_optimistic`]; a transient error on the last attempt is
/// returned as [`RetryError::Failed`].
pub async fn retry_optimistic_with<T, E, F, Fut>(
    policy: &RetryPolicy,
    is_transient: impl Fn(&E) -> bool,
    mut attempt: F,
) -> std::result::Result<Committed<T>, RetryError<E>>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = std::result::Result<Attempt<T>, E>>,
{
    let mut backoff = policy.backoff();
    for n in 1..=policy.max_attempts {
        match attempt(n).await {
            Ok(Attempt::Committed(value)) => return Ok(Committed { value, attempts: n }),
            Ok(Attempt::Conflict) => {}
            Err(error) if is_transient(&error) && n < policy.max_attempts => {}
            Err(error) => return Err(RetryError::Failed { error, attempts: n }),
        }
        if n < policy.max_attempts {
            tokio::time::sleep(backoff.next_delay()).await;
        }
    }
    Err(RetryError::Exhausted {
        attempts: policy.max_attempts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn gives_up_at_the_bound() {
        let policy =
            RetryPolicy::new(4, Duration::from_millis(1), Duration::from_millis(8)).unwrap();
        let mut calls = 0;
        let r: std::result::Result<Committed<()>, RetryError<()>> =
            retry_optimistic(&policy, |_| {
                calls += 1;
                async { Ok(Attempt::Conflict) }
            })
            .await;
        assert!(matches!(r, Err(RetryError::Exhausted { attempts: 4 })));
        assert_eq!(calls, 4);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_transient_errors_only() {
        let policy = RetryPolicy::default();
        let r = retry_optimistic_with(
            &policy,
            |e: &&str| *e == "deadlock",
            |n| async move {
                if n == 1 {
                    Err("deadlock")
                } else {
                    Ok(Attempt::Committed(n))
                }
            },
        )
        .await
        .unwrap();
        assert_eq!(
            r,
            Committed {
                value: 2,
                attempts: 2
            }
        );
        let r = retry_optimistic_with(
            &policy,
            |e: &&str| *e == "deadlock",
            |_| async { Err::<Attempt<()>, _>("constraint") },
        )
        .await;
        assert!(matches!(r, Err(RetryError::Failed { attempts: 1, .. })));
    }

    #[test]
    fn policy_is_validated() {
        assert!(RetryPolicy::new(0, Duration::ZERO, Duration::ZERO).is_err());
        assert!(RetryPolicy::new(1, Duration::from_secs(2), Duration::from_secs(1)).is_err());
    }
}
