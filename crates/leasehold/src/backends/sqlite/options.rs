//! [`SqliteOptions`]: how a [`SqliteBackend`](super::SqliteBackend) opens
//! its database file.

use std::time::Duration;

use crate::backend::DEFAULT_IDLE_WINDOW;

/// How to open an SQLite store.
///
/// ```
/// use std::time::Duration;
/// use leasehold::backends::sqlite::SqliteOptions;
/// let options = SqliteOptions::new()
///     .with_synchronous_full(false)
///     .with_busy_timeout(Duration::from_secs(2));
/// assert!(!options.synchronous_full());
/// assert_eq!(options.busy_timeout(), Duration::from_secs(2));
/// ```
#[derive(Debug, Clone)]
pub struct SqliteOptions {
    synchronous_full: bool,
    busy_timeout: Duration,
    idle_window: Option<Duration>,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            synchronous_full: true,
            busy_timeout: Duration::from_secs(5),
            idle_window: Some(DEFAULT_IDLE_WINDOW),
        }
    }
}

impl SqliteOptions {
    /// Defaults: `synchronous=FULL`, busy timeout 5 s.
    pub fn new() -> Self {
        Self::default()
    }

    setters! {
        /// `synchronous=FULL` (the default) syncs every commit to disk, so the
        /// fence counter survives a power loss. `false` uses `NORMAL`: faster,
        /// still safe against process crashes, but a power loss may roll back the
        /// last commits and with them the fence. URL option
        /// `?synchronous=full|normal`.
        with_synchronous_full(full: bool) => synchronous_full = full;

        /// How long a statement waits for another process's write lock before
        /// failing with a retryable error (default 5 s). An acquisition waits
        /// only as long as its caller's wait bound instead
        /// ([`AcquireRequest::lock_wait`](crate::backend::AcquireRequest::lock_wait))
        /// and then reports the key busy.
        with_busy_timeout(timeout: Duration) => busy_timeout = timeout;

        /// How long the records of a key nobody holds stay in the file
        /// (default an hour; `None` keeps them forever, as versions before
        /// this one did). A later sweep removes them, and a key that comes
        /// back still gets a token above every one it had (docs/storage.md).
        /// URL option `?idle_window=30s|10m|1h|never`.
        with_idle_window(window: Option<Duration>) => idle_window = window;
    }

    /// Whether every commit is synced to disk (`synchronous=FULL`).
    pub fn synchronous_full(&self) -> bool {
        self.synchronous_full
    }

    /// How long a statement waits for another process's write lock.
    pub fn busy_timeout(&self) -> Duration {
        self.busy_timeout
    }

    /// How long idle records stay; `None`: forever.
    pub fn idle_window(&self) -> Option<Duration> {
        self.idle_window
    }
}
