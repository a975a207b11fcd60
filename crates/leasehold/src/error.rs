//! The one error type of the crate.

use std::time::Duration;

/// A boxed error from a store driver, kept whole so `source()` chains work.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Shorthand for `Result<T, leasehold::Error>`.
///
/// The default `E = Error` applies where a type is written, not in an
/// expression: a task ending in `leasehold::Result::Ok(())` leaves its
/// error type to inference, and `?` in it converts into any type that is
/// `From<leasehold::Error>`, so the compiler cannot pick one (E0282/E0283;
/// `leasehold::Error` itself has several `From` impls, `sqlx::Error` with
/// the SQL stores):
///
/// ```compile_fail
/// # async fn f(locks: leasehold::Locks) -> leasehold::Result<()> {
/// let task = tokio::spawn(async move {
///     locks.try_acquire("orders:1").await?.release().await?;
///     leasehold::Result::Ok(())
/// });
/// task.await.expect("the task did not panic")?;
/// # Ok(()) }
/// ```
///
/// Name the error type in the task's last expression instead:
///
/// ```
/// use leasehold::Locks;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> leasehold::Result<()> {
/// let locks = Locks::open("memory://").await?;
/// let tasks: Vec<_> = ["orders:1", "orders:2"]
///     .into_iter()
///     .map(|key| {
///         let locks = locks.clone();
///         tokio::spawn(async move {
///             let guard = locks.try_acquire(key).await?;
///             // ... the work, with guard.token() in its writes
///             guard.release().await?;
///             Ok::<_, leasehold::Error>(())
///         })
///     })
///     .collect();
/// for task in tasks {
///     task.await.expect("the task did not panic")?;
/// }
/// # Ok(()) }
/// ```
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
        /// The parser's own error, when one found the problem (a driver's
        /// URL parser, say); its text is part of `problem` too.
        #[source]
        source: Option<BoxError>,
    },

    /// `try_acquire` found a live holder. Try again later.
    ///
    /// The message says what the primitive's state is: a mutex held, every
    /// permit of a semaphore taken, a reader-writer lock closed to readers
    /// by a writer (holding, or waiting with its marker), or not free for a
    /// writer.
    #[error("{}", busy_message(key, holder, *remaining, *kind))]
    Busy {
        /// The contested key.
        key: String,
        /// The holder's human label (`host:pid`), for display only: for a
        /// semaphore the permit that expires first, for a reader-writer
        /// lock the holder or waiting writer that blocked the attempt.
        holder: String,
        /// The longest the current lease can still last, by the store's clock.
        remaining: Duration,
        /// What was asked for: a mutex, a permit of a semaphore of N, or a
        /// side of a reader-writer lock.
        kind: LockKind,
    },

    /// The lock was not acquired within the caller's wait bound.
    #[error("lock {key:?} was not acquired within {}{}", Millis(*waited),
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
        /// The holder's label (`host:pid`) as the store reported it at the
        /// wait's last attempt; `None` if the wait ended before any attempt
        /// (queued behind other waiters of this process). Set together with
        /// `remaining`.
        holder: Option<String>,
        /// The longest that holder's lease could still last when the wait
        /// ended: the remaining ttl the store reported at the last attempt,
        /// less the time since. A "retry after" hint; `None` with `holder`.
        remaining: Option<Duration>,
    },

    /// The caller cancelled the wait.
    #[error("waiting for lock {key:?} was cancelled")]
    Cancelled {
        /// The key that was being waited for.
        key: String,
    },

    /// The key is a lock of another kind than the one asked for: one key is
    /// one lock, and it keeps the kind it was first used as (a mutex key
    /// that nobody holds becomes a reader-writer lock or a semaphore on
    /// first such use). A semaphore key refuses a mutex or a reader-writer
    /// lock, and a reader-writer lock's key refuses a semaphore (a mutex
    /// acquire of it is its writer). Refused at once, never waited on, and
    /// not retryable: the program uses one name for two locks; use another
    /// key for one of them.
    #[error("key {key:?} is a {held}; a {requested} of the same name is refused: use another key")]
    KindMismatch {
        /// The key.
        key: String,
        /// The kind the key is at the store.
        held: crate::kind::KeyKind,
        /// The kind that was asked for.
        requested: crate::kind::KeyKind,
    },

    /// The lease ended (expired or broken) before the operation could use it.
    #[error("the lease on {key:?} was lost")]
    LeaseLost {
        /// The key whose lease was lost.
        key: String,
    },

    /// The store could not be reached or answered with a transient failure
    /// (connection refused, timeout, database locked). Retrying may succeed.
    #[error("store unavailable{}: {source}", StoreName(*store))]
    Unavailable {
        /// The store the error came from (`"postgres"`, `"redis"`, ...), when
        /// known; see [`Error::store`].
        store: Option<&'static str>,
        /// The driver's error.
        #[source]
        source: BoxError,
    },

    /// The store answered with an error that retrying will not fix
    /// (permissions, corrupt data, a schema it does not understand).
    #[error("store error{}: {source}", StoreName(*store))]
    Backend {
        /// The store the error came from (`"postgres"`, `"redis"`, ...), when
        /// known; see [`Error::store`].
        store: Option<&'static str>,
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
            | Error::KindMismatch { .. }
            | Error::Backend { .. } => false,
        }
    }

    /// Whether this is [`Error::LeaseLost`]: the lease ended before the
    /// operation could use it, so the work done under it must be abandoned
    /// (roll back; do not write). Matches a lost lease without naming the
    /// variant's fields, also through your own error type:
    ///
    /// ```
    /// #[derive(Debug, thiserror::Error)]
    /// enum AppError {
    ///     #[error(transparent)]
    ///     Lock(#[from] leasehold::Error),
    ///     #[error("bad order: {0}")]
    ///     BadOrder(String),
    /// }
    ///
    /// impl AppError {
    ///     fn is_lease_lost(&self) -> bool {
    ///         matches!(self, AppError::Lock(e) if e.is_lease_lost())
    ///     }
    /// }
    ///
    /// let lost = AppError::from(leasehold::Error::LeaseLost { key: "orders:42".into() });
    /// assert!(lost.is_lease_lost());
    /// assert!(!AppError::BadOrder("empty".into()).is_lease_lost());
    /// ```
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, Error::LeaseLost { .. })
    }

    /// Builds an [`Error::InvalidInput`].
    pub fn invalid(what: &'static str, problem: impl Into<String>) -> Self {
        Error::InvalidInput {
            what,
            problem: problem.into(),
            source: None,
        }
    }

    /// Builds an [`Error::InvalidInput`] for a problem a parser found: the
    /// problem reads `"{context}: {source}"`, and `source` stays reachable
    /// through [`std::error::Error::source`] (to downcast it, say).
    ///
    /// ```
    /// let e = leasehold::Error::invalid_from("store url", "not a URL", "relative URL without a base");
    /// assert_eq!(e.to_string(), "invalid store url: not a URL: relative URL without a base");
    /// assert!(std::error::Error::source(&e).is_some());
    /// ```
    pub fn invalid_from(
        what: &'static str,
        context: impl std::fmt::Display,
        source: impl Into<BoxError>,
    ) -> Self {
        let source = source.into();
        Error::InvalidInput {
            what,
            problem: format!("{context}: {source}"),
            source: Some(source),
        }
    }

    /// Wraps a driver error that retrying may fix.
    pub fn unavailable(source: impl Into<BoxError>) -> Self {
        Error::Unavailable {
            store: None,
            source: source.into(),
        }
    }

    /// Wraps a driver error that retrying will not fix.
    pub fn backend(source: impl Into<BoxError>) -> Self {
        Error::Backend {
            store: None,
            source: source.into(),
        }
    }

    /// A driver error of `store` that a store has classified:
    /// [`Error::Unavailable`] if `transient` (retrying may fix it),
    /// [`Error::Backend`] otherwise.
    #[cfg_attr(
        not(any(
            feature = "sqlite",
            feature = "postgres",
            feature = "mongodb",
            feature = "etcd"
        )),
        allow(dead_code)
    )]
    pub(crate) fn from_store(
        store: &'static str,
        transient: bool,
        source: impl Into<BoxError>,
    ) -> Self {
        if transient {
            Error::unavailable(source)
        } else {
            Error::backend(source)
        }
        .in_store(store)
    }

    /// This error naming `store` (`"postgres"`, `"redis"`, ...) as the one
    /// it came from, if it is a store error ([`Error::Unavailable`] or
    /// [`Error::Backend`]) that names none yet; other errors are returned
    /// as they are. Stores call it on every error they classify.
    ///
    /// ```
    /// let e = leasehold::Error::unavailable("connection refused").in_store("redis");
    /// assert_eq!(e.store(), Some("redis"));
    /// assert_eq!(e.to_string(), "store unavailable (redis): connection refused");
    /// ```
    pub fn in_store(mut self, name: &'static str) -> Self {
        if let Error::Unavailable { store, .. } | Error::Backend { store, .. } = &mut self {
            store.get_or_insert(name);
        }
        self
    }

    /// The store a store error came from (`"sqlite"`, `"postgres"`,
    /// `"redis"`, `"mongodb"`, or a custom backend's name), if it says.
    pub fn store(&self) -> Option<&'static str> {
        match self {
            Error::Unavailable { store, .. } | Error::Backend { store, .. } => *store,
            _ => None,
        }
    }

    /// This error with the secrets of `url` (the store URL it came from)
    /// taken out of its text. Applied where a URL is opened: a driver's
    /// message may echo the URL or the password. A driver error whose text
    /// (causes and `Debug` included) reveals nothing is kept as it is, so
    /// callers can still downcast it.
    pub(crate) fn without_secrets_of(self, url: &str) -> Self {
        use crate::cause::error_chain as chain;
        use crate::redact::{redact_secrets, reveals_secret};
        let redact_source = |source: BoxError| -> BoxError {
            let text = format!("{} {:?}", chain(&*source), source);
            if reveals_secret(&text, url) {
                Box::new(Redacted(redact_secrets(&chain(&*source), url)))
            } else {
                source
            }
        };
        match self {
            Error::InvalidInput {
                what,
                problem,
                source,
            } => Error::InvalidInput {
                what,
                problem: redact_secrets(&problem, url),
                source: source.map(redact_source),
            },
            Error::Unavailable { store, source } => Error::Unavailable {
                store,
                source: redact_source(source),
            },
            Error::Backend { store, source } => Error::Backend {
                store,
                source: redact_source(source),
            },
            other => other,
        }
    }
}

/// A driver error's text after its secrets were taken out (the original
/// error is dropped: its `source()` chain and `Debug` would still show them).
#[derive(Debug)]
struct Redacted(String);

impl std::fmt::Display for Redacted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Redacted {}

/// ` (postgres)` after "store unavailable" when the store is known.
struct StoreName(Option<&'static str>);

impl std::fmt::Display for StoreName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(store) => write!(f, " ({store})"),
            None => Ok(()),
        }
    }
}

/// Shows a measured duration to the millisecond (`5.002s`, `250ms`):
/// nanoseconds of a timer's overshoot are noise in a message. Durations
/// under a millisecond keep their precision, so they never print as `0ms`.
/// What a busy attempt asked for ([`Error::Busy`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockKind {
    /// A mutex (also a row lock of the pessimistic helpers).
    Mutex,
    /// A permit of a semaphore of this many permits.
    Semaphore {
        /// The semaphore's number of permits.
        permits: u32,
    },
    /// The shared (reader) side of a reader-writer lock.
    Read,
    /// The exclusive (writer) side of a reader-writer lock.
    Write,
}

fn busy_message(key: &str, holder: &str, remaining: Duration, kind: LockKind) -> String {
    let left = Millis(remaining);
    match kind {
        LockKind::Mutex => format!("lock {key:?} is held by {holder} for up to {left} more"),
        LockKind::Semaphore { permits: 1 } => format!(
            "the 1 permit of semaphore {key:?} is taken, by {holder} for up to {left} more"
        ),
        LockKind::Semaphore { permits } => format!(
            "all {permits} permits of semaphore {key:?} are taken; the first frees within {left} (held by {holder})"
        ),
        LockKind::Read => format!(
            "rw lock {key:?} is closed to readers: writer {holder} holds it or waits for it, for up to {left} more"
        ),
        LockKind::Write => format!(
            "rw lock {key:?} is not free for a writer: {holder} holds it or waits for it, for up to {left} more"
        ),
    }
}

struct Millis(Duration);

impl std::fmt::Display for Millis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let d = self.0;
        if d < Duration::from_millis(1) {
            return write!(f, "{d:?}");
        }
        // Round to the nearest millisecond (half up), then print like
        // Duration's Debug does: seconds with up to 3 decimals, else ms.
        let ms = (d.as_nanos() + 500_000) / 1_000_000;
        let (secs, frac) = (ms / 1000, ms % 1000);
        if secs == 0 {
            write!(f, "{ms}ms")
        } else if frac == 0 {
            write!(f, "{secs}s")
        } else {
            let frac = format!("{frac:03}");
            write!(f, "{secs}.{}s", frac.trim_end_matches('0'))
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
            holder: None,
            remaining: None,
        }
        .is_retryable());
        assert!(!Error::invalid("key", "empty").is_retryable());
        assert!(!Error::backend("corrupt").is_retryable());
        assert!(!Error::LeaseLost { key: "k".into() }.is_retryable());
        let mismatch = Error::KindMismatch {
            key: "x".into(),
            held: crate::kind::KeyKind::Semaphore,
            requested: crate::kind::KeyKind::Mutex,
        };
        assert!(!mismatch.is_retryable());
        assert_eq!(
            mismatch.to_string(),
            r#"key "x" is a semaphore; a mutex of the same name is refused: use another key"#
        );
    }

    #[test]
    fn messages_are_lowercase_and_specific() {
        let e = Error::invalid("key", "must be at most 256 bytes, got 300");
        assert_eq!(
            e.to_string(),
            "invalid key: must be at most 256 bytes, got 300"
        );
    }

    /// A driver error that echoes the URL, as some do for parse errors.
    #[derive(Debug)]
    struct Echo(String);
    impl std::fmt::Display for Echo {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "cannot use {}", self.0)
        }
    }
    impl std::error::Error for Echo {}

    #[test]
    fn secrets_of_the_url_are_taken_out_of_every_variant() {
        use std::error::Error as _;
        let url = "postgres://app:hunter22@db/orders";
        let echoing = [
            Error::invalid("store url", format!("{url} is bad")),
            Error::invalid_from("store url", "cannot parse", Echo(url.to_owned())),
            Error::unavailable(Echo(url.to_owned())),
            Error::backend(Echo("hunter22".to_owned())),
        ];
        for e in echoing {
            let e = e.without_secrets_of(url);
            let text = format!(
                "{e} {e:?} {}",
                e.source().map(|s| s.to_string()).unwrap_or_default()
            );
            assert!(!text.contains("hunter22"), "{text}");
            assert!(text.contains("***"), "{text}");
        }
    }

    #[test]
    fn store_errors_name_their_store_through_redaction() {
        let e = Error::backend("no such table")
            .in_store("sqlite")
            .without_secrets_of("sqlite:///x.db")
            // The first store named wins: a wrapper cannot rename it.
            .in_store("custom");
        assert_eq!(e.store(), Some("sqlite"));
        assert_eq!(e.to_string(), "store error (sqlite): no such table");
        assert_eq!(
            Error::unavailable("refused").to_string(),
            "store unavailable: refused"
        );
        assert_eq!(
            Error::invalid("key", "empty").in_store("redis").store(),
            None
        );
    }

    #[test]
    fn a_parse_error_stays_the_source_of_invalid_input() {
        use std::error::Error as _;
        let parse = "x:y".parse::<u16>().unwrap_err();
        let e = Error::invalid_from("store url", "bad port", parse.clone());
        assert_eq!(
            e.to_string(),
            format!("invalid store url: bad port: {parse}")
        );
        let source = e
            .without_secrets_of("redis://:hunter22@h")
            .source()
            .map(|s| s.downcast_ref::<std::num::ParseIntError>().cloned());
        assert_eq!(source, Some(Some(parse)), "kept whole: nothing to redact");
    }

    #[test]
    fn a_driver_error_without_secrets_is_kept_whole() {
        use std::error::Error as _;
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = Error::unavailable(io).without_secrets_of("redis://:hunter22@cache");
        assert!(e
            .source()
            .unwrap()
            .downcast_ref::<std::io::Error>()
            .is_some());
    }

    #[test]
    fn measured_durations_show_milliseconds() {
        let timeout = |waited| Error::Timeout {
            key: "k".into(),
            waited,
            held_here: false,
            holder: Some("h:1".into()),
            remaining: Some(Duration::from_secs(3)),
        };
        assert_eq!(
            timeout(Duration::from_nanos(5_001_659_909)).to_string(),
            r#"lock "k" was not acquired within 5.002s"#
        );
        let busy = |kind| Error::Busy {
            key: "k".into(),
            holder: "h:1".into(),
            remaining: Duration::from_nanos(29_999_600_000),
            kind,
        };
        assert_eq!(
            busy(LockKind::Mutex).to_string(),
            r#"lock "k" is held by h:1 for up to 30s more"#
        );
        assert_eq!(
            busy(LockKind::Semaphore { permits: 2 }).to_string(),
            r#"all 2 permits of semaphore "k" are taken; the first frees within 30s (held by h:1)"#
        );
        assert_eq!(
            busy(LockKind::Read).to_string(),
            r#"rw lock "k" is closed to readers: writer h:1 holds it or waits for it, for up to 30s more"#
        );
        assert_eq!(
            busy(LockKind::Write).to_string(),
            r#"rw lock "k" is not free for a writer: h:1 holds it or waits for it, for up to 30s more"#
        );
        let shown = |d| Millis(d).to_string();
        assert_eq!(shown(Duration::from_micros(250_400)), "250ms");
        assert_eq!(shown(Duration::from_millis(1_500)), "1.5s");
        assert_eq!(shown(Duration::from_millis(61_020)), "61.02s");
        assert_eq!(shown(Duration::from_micros(999_600)), "1s");
        assert_eq!(shown(Duration::from_micros(300)), "300µs");
        assert_eq!(shown(Duration::ZERO), "0ns");
    }

    #[test]
    fn lease_lost_is_recognised() {
        assert!(Error::LeaseLost { key: "k".into() }.is_lease_lost());
        assert!(!Error::unavailable("down").is_lease_lost());
        assert!(!Error::Cancelled { key: "k".into() }.is_lease_lost());
    }

    #[test]
    fn a_timeout_behind_this_process_says_so() {
        let timeout = |held_here| Error::Timeout {
            key: "k".into(),
            waited: Duration::from_secs(5),
            held_here,
            holder: None,
            remaining: None,
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
