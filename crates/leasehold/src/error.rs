//! The one error type of the crate.

use std::time::Duration;

/// A boxed error from a store driver, kept whole so `source()` chains work.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Shorthand for `Result<T, leasehold::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong, named for what the caller does next.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The call itself is wrong (bad key, ttl out of range, unknown URL
    /// scheme). Nothing was sent to the store; fix the call.
    #[error("invalid {what}: {problem}")]
    InvalidInput {
        /// Which input was rejected (`key`, `ttl`, `wait`, `store url`, ...).
        what: &'static str,
        /// What was wrong with it and what is allowed.
        problem: String,
    },

    /// `try_acquire` found a live holder. Try again later.
    #[error("lock {key:?} is held by {holder} for up to {remaining:?} more")]
    Busy {
        /// The contested key.
        key: String,
        /// The holder's human label (`host:pid`), for display only.
        holder: String,
        /// The longest the current lease can still last, by the store's clock.
        remaining: Duration,
    },

    /// The lock was not acquired within the caller's wait bound.
    #[error("lock {key:?} was not acquired within {waited:?}{}",
        if *held_here { " (a guard of this same process holds it: release or drop that guard)" } else { "" })]
    Timeout {
        /// The contested key.
        key: String,
        /// How long the caller waited.
        waited: Duration,
        /// Whether, when the wait ended, a live guard of this same process
        /// (from this [`Locks`](crate::Locks) or a clone) held the key: the
        /// wait was behind the caller's own program.
        held_here: bool,
    },

    /// The caller cancelled the wait.
    #[error("waiting for lock {key:?} was cancelled")]
    Cancelled {
        /// The key that was being waited for.
        key: String,
    },

    /// The lease ended (expired or broken) before the operation could use it.
    #[error("the lease on {key:?} was lost")]
    LeaseLost {
        /// The key whose lease was lost.
        key: String,
    },

    /// The store could not be reached or answered with a transient failure
    /// (connection refused, timeout, database locked). Retrying may succeed.
    #[error("store unavailable: {source}")]
    Unavailable {
        /// The driver's error.
        #[source]
        source: BoxError,
    },

    /// The store answered with an error that retrying will not fix
    /// (permissions, corrupt data, a schema it does not understand).
    #[error("store error: {source}")]
    Backend {
        /// The driver's error.
        #[source]
        source: BoxError,
    },
}

impl Error {
    /// Whether the same call may succeed if made again later.
    ///
    /// `Busy`, `Timeout` and `Unavailable` are retryable; input errors, a lost
    /// lease, cancellation and permanent store errors are not.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Busy { .. } | Error::Timeout { .. } | Error::Unavailable { .. } => true,
            Error::InvalidInput { .. }
            | Error::Cancelled { .. }
            | Error::LeaseLost { .. }
            | Error::Backend { .. } => false,
        }
    }

    /// Builds an [`Error::InvalidInput`].
    pub fn invalid(what: &'static str, problem: impl Into<String>) -> Self {
        Error::InvalidInput {
            what,
            problem: problem.into(),
        }
    }

    /// Wraps a driver error that retrying may fix.
    pub fn unavailable(source: impl Into<BoxError>) -> Self {
        Error::Unavailable {
            source: source.into(),
        }
    }

    /// Wraps a driver error that retrying will not fix.
    pub fn backend(source: impl Into<BoxError>) -> Self {
        Error::Backend {
            source: source.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_classification() {
        assert!(Error::unavailable("down").is_retryable());
        assert!(Error::Timeout {
            key: "k".into(),
            waited: Duration::from_secs(1),
            held_here: false,
        }
        .is_retryable());
        assert!(!Error::invalid("key", "empty").is_retryable());
        assert!(!Error::backend("corrupt").is_retryable());
        assert!(!Error::LeaseLost { key: "k".into() }.is_retryable());
    }

    #[test]
    fn messages_are_lowercase_and_specific() {
        let e = Error::invalid("key", "must be at most 256 bytes, got 300");
        assert_eq!(
            e.to_string(),
            "invalid key: must be at most 256 bytes, got 300"
        );
    }

    #[test]
    fn a_timeout_behind_this_process_says_so() {
        let timeout = |held_here| Error::Timeout {
            key: "k".into(),
            waited: Duration::from_secs(5),
            held_here,
        };
        assert_eq!(
            timeout(false).to_string(),
            "lock \"k\" was not acquired within 5s"
        );
        assert_eq!(
            timeout(true).to_string(),
            "lock \"k\" was not acquired within 5s (a guard of this same process holds it: \
             release or drop that guard)"
        );
    }

    #[test]
    fn source_is_kept() {
        use std::error::Error as _;
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = Error::unavailable(io);
        assert_eq!(e.source().unwrap().to_string(), "refused");
    }
}
