//! [`RedisOptions`]: how a [`RedisBackend`](super::RedisBackend) connects
//! and where it keeps its records.

use std::time::Duration;

use super::keys::Namespace;
use crate::backend::{check_idle_window, DEFAULT_IDLE_WINDOW};
use crate::error::{Error, Result};
use crate::scheme::options::redis_count;
use crate::scheme::parse_idle_window;
use crate::scheme::StoreUrl;

/// How to connect and where to keep the records.
///
/// ```
/// use std::time::Duration;
/// use leasehold::backends::redis::RedisOptions;
/// let options = RedisOptions::new()
///     .with_prefix("app:locks")
///     .with_response_timeout(Duration::from_secs(2));
/// assert_eq!(options.prefix(), "app:locks");
/// ```
#[derive(Debug, Clone)]
pub struct RedisOptions {
    prefix: String,
    pub(super) connect_timeout: Duration,
    pub(super) response_timeout: Duration,
    pub(super) check_persistence: bool,
    pub(super) min_replicas: u32,
    pub(super) max_connections: usize,
    pub(super) idle_window: Option<Duration>,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            prefix: "leasehold".to_owned(),
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(5),
            check_persistence: true,
            min_replicas: 0,
            max_connections: 4,
            idle_window: Some(DEFAULT_IDLE_WINDOW),
        }
    }
}

impl RedisOptions {
    /// Defaults: prefix `leasehold`, connect timeout 2 s, response timeout
    /// 5 s, persistence check on.
    pub fn new() -> Self {
        Self::default()
    }

    setters! {
        /// The first part of every Redis key and channel this store uses
        /// (default `leasehold`): 1 to 64 bytes, no braces, no control
        /// characters (checked when connecting, before any I/O). Stores with
        /// different prefixes on one server never see each other's locks.
        with_prefix(prefix: impl Into<String>) => prefix = prefix.into();

        /// How long one attempt to open a connection may take (default 2 s).
        /// [`RedisBackend::connect`](super::RedisBackend::connect) makes up to three attempts.
        with_connect_timeout(timeout: Duration) => connect_timeout = timeout;

        /// How long a command may wait for its reply (default 5 s); past it the
        /// call fails with [`Error::Unavailable`](crate::Error::Unavailable).
        with_response_timeout(timeout: Duration) => response_timeout = timeout;

        /// Whether to read `appendonly`, `appendfsync` and `maxmemory-policy`
        /// on connect and warn about settings that weaken fencing (default on).
        with_persistence_check(check: bool) => check_persistence = check;

        /// How many replicas must confirm every script call before it returns
        /// (default 0: the primary's answer is enough). With `n` > 0 each call
        /// is followed, on the same connection, by `WAIT n timeout`, the timeout
        /// being half the response timeout; a call confirmed by fewer replicas
        /// fails with [`Error::Unavailable`](crate::Error::Unavailable), and a
        /// grant that was not confirmed is released again (best effort) and
        /// never returned. See docs/redis.md, "Cluster and replicas", for what
        /// this promises and what it costs.
        with_min_replicas(n: u32) => min_replicas = n;

        /// How many command connections a backend opened from a URL may
        /// hold at once (default 4, at least 1). Each carries one call at a
        /// time: a lone caller uses one, concurrent calls open more up to
        /// this bound and then queue for a free one. Not used on a cluster or
        /// on your own connection manager, which multiplex.
        with_max_connections(n: usize) => max_connections = n;

        /// How long a key's records (its fence, and a semaphore's or rw
        /// lock's slots, fence and kind) stay after its last holder left
        /// (default an hour; `None` keeps them forever, as versions before
        /// this one did). Redis deletes them by their ttl; a key that comes
        /// back starts its fence at the server's clock in microseconds,
        /// above every token it had (docs/storage.md). URL option
        /// `?idle_window=30s|10m|1h|never`.
        with_idle_window(window: Option<Duration>) => idle_window = window;
    }

    /// How many command connections a backend may hold at once.
    pub fn max_connections(&self) -> usize {
        self.max_connections
    }

    /// How long idle records stay; `None`: forever.
    pub fn idle_window(&self) -> Option<Duration> {
        self.idle_window
    }

    /// How many replicas must confirm every script call.
    pub fn min_replicas(&self) -> u32 {
        self.min_replicas
    }

    /// The key and channel prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// How long one attempt to open a connection may take.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// How long a command may wait for its reply.
    pub fn response_timeout(&self) -> Duration {
        self.response_timeout
    }

    /// Whether persistence settings are checked on connect.
    pub fn persistence_check(&self) -> bool {
        self.check_persistence
    }

    /// The options a store URL sets (`prefix`, `min_replicas`,
    /// `max_connections`), on top of the defaults.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a value that is not a whole number.
    pub(crate) fn from_url(url: &StoreUrl) -> Result<RedisOptions> {
        let mut options = RedisOptions::new();
        if let Some(prefix) = url.option("prefix") {
            options = options.with_prefix(prefix);
        }
        if let Some(n) = url.option("min_replicas") {
            options = options.with_min_replicas(redis_count("min_replicas", n)?);
        }
        if let Some(n) = url.option("max_connections") {
            options = options.with_max_connections(redis_count("max_connections", n)?);
        }
        if let Some(window) = url.option("idle_window") {
            options = options.with_idle_window(parse_idle_window(window)?);
        }
        Ok(options)
    }

    /// Checks the options before any I/O; the namespace of the prefix.
    pub(super) fn validate(&self) -> Result<Namespace> {
        for (what, t) in [
            ("redis connect timeout", self.connect_timeout),
            ("redis response timeout", self.response_timeout),
        ] {
            if t.is_zero() {
                return Err(Error::invalid(what, "must be more than zero"));
            }
        }
        check_idle_window(self.idle_window)?;
        if self.max_connections == 0 {
            return Err(Error::invalid(
                "redis max connections",
                "must be at least 1",
            ));
        }
        Namespace::new(&self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheme::Scheme;

    #[test]
    fn url_options_are_read_and_checked_before_any_io() {
        let (_, url) =
            Scheme::parse("redis://h/2?prefix=app&min_replicas=1&max_connections=2").unwrap();
        let options = RedisOptions::from_url(&url).unwrap();
        assert_eq!(
            (
                options.prefix(),
                options.min_replicas(),
                options.max_connections()
            ),
            ("app", 1, 2)
        );
        let problem = |url| Scheme::parse(url).unwrap_err().to_string();
        assert!(problem("redis://h?max_connections=many")
            .contains("max_connections must be a whole number of connections"));
        assert!(problem("redis+cluster://a:1?min_replicas=-1")
            .contains("min_replicas must be a whole number of replicas"));
        let none = RedisOptions::new().with_max_connections(0).validate();
        assert!(none.unwrap_err().to_string().contains("must be at least 1"));
    }
}
