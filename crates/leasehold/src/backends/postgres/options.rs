//! [`PostgresOptions`]: how a [`PostgresBackend`](super::PostgresBackend) is set up.

use std::time::Duration;

use crate::backend::DEFAULT_IDLE_WINDOW;

use super::names::DEFAULT_TABLE;
use super::pooler::Pooler;
#[cfg(doc)]
use super::PostgresBackend;
#[cfg(doc)]
use crate::error::Error;

/// How to set up a [`PostgresBackend`].
///
/// ```
/// use std::time::Duration;
/// use leasehold::backends::postgres::PostgresOptions;
/// let options = PostgresOptions::new()
///     .with_table("app.locks")
///     .with_acquire_timeout(Duration::from_secs(2));
/// assert_eq!(options.table(), "app.locks");
/// ```
#[derive(Clone)]
pub struct PostgresOptions {
    pub(super) table: String,
    pub(super) migrate: bool,
    pub(super) listen_url: Option<String>,
    pub(super) max_connections: u32,
    pub(super) idle_timeout: Duration,
    pub(super) acquire_timeout: Duration,
    pub(super) pooler: Pooler,
    pub(super) idle_window: Option<Duration>,
}

/// Data connections of a backend made by `connect`: a lock client issues
/// one short statement at a time, so one connection serves a process, and
/// at 1 it also carries `LISTEN` (see [`PostgresOptions::with_max_connections`]).
pub const DEFAULT_MAX_CONNECTIONS: u32 = 1;
/// How long an unused data connection stays open.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// By hand: the listen URL's password stays out of `{:?}`.
impl std::fmt::Debug for PostgresOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresOptions")
            .field("table", &self.table)
            .field("migrate", &self.migrate)
            .field(
                "listen_url",
                &self.listen_url.as_deref().map(crate::redact::redact_url),
            )
            .field("max_connections", &self.max_connections)
            .field("idle_timeout", &self.idle_timeout)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("idle_window", &self.idle_window)
            .finish()
    }
}

impl Default for PostgresOptions {
    fn default() -> Self {
        PostgresOptions {
            table: DEFAULT_TABLE.to_owned(),
            migrate: true,
            listen_url: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            acquire_timeout: Duration::from_secs(5),
            pooler: Pooler::None,
            idle_window: Some(DEFAULT_IDLE_WINDOW),
        }
    }
}

impl PostgresOptions {
    /// Defaults: table `leasehold_locks`, migrate on connect, no pooler,
    /// 1 data connection closed after 5 s unused, 5 s to get a connection.
    pub fn new() -> Self {
        Self::default()
    }

    setters! {
        /// The lease table, `table` or `schema.table` of ASCII letters, digits
        /// and `_`: a schema of at most 63 bytes, a table of at most 55, as
        /// the semaphores' table `<table>_permits` sits beside it (checked by
        /// `connect`/`from_pool` before any I/O; quoted in SQL, so case is
        /// kept).
        with_table(table: &str) => table = table.to_owned();

        /// Whether to create the table on connect (default true).
        with_migrate(migrate: bool) => migrate = migrate;

        /// Opens the `LISTEN` connection from this URL instead of the pool: for
        /// pools behind PgBouncer in transaction mode, where `LISTEN` does not
        /// work. Point it at the server or a session-mode pool. URL option
        /// `?listen_url=postgres://...`.
        with_listen_url(url: &str) => listen_url = Some(url.to_owned());

        /// What sits between the store and the server (default
        /// [`Pooler::None`]). [`Pooler::Transaction`] for PgBouncer in
        /// transaction mode: statements go unprepared, and without a listen URL
        /// waiters poll instead of listening. URL option `?pooler=transaction`.
        with_pooler(pooler: Pooler) => pooler = pooler;

        /// Data connections of [`PostgresBackend::connect_with`] (default 1, at
        /// least 1; URL option `max_connections=N`). None is kept while unused
        /// (see [`with_idle_timeout`](Self::with_idle_timeout)), and waiting
        /// never holds one.
        ///
        /// At 1 (without a pooler or a listen URL) the process's one connection
        /// per URL, shared by every backend on it, carries the lock statements
        /// and `LISTEN`: a budget of 1. Above 1 the lock statements get a pool
        /// of this size and the listener a connection beside it: N + 1. Raise
        /// it for many concurrent lock operations, or for waiters that should
        /// wait at the server for rows other transactions lock (on the shared
        /// connection such a wait is cut to 50 ms and retried).
        with_max_connections(max: u32) => max_connections = max;

        /// How long a data connection may sit unused before it is closed
        /// (default 5 s; URL option `idle_timeout=5s`, in `ms` or `s`). The
        /// pool's housekeeping runs at this interval, so a connection goes
        /// between one and two timeouts after its last use.
        with_idle_timeout(timeout: Duration) => idle_timeout = timeout;

        /// How long [`PostgresBackend::connect_with`]'s pool waits for a
        /// connection, including connecting to a server that is down, before
        /// failing with [`Error::Unavailable`] (default 5 s; URL option
        /// `acquire_timeout=5s`). A server that refuses connections (`too many
        /// clients`, down) fails an operation sooner: see [`PostgresBackend`].
        with_acquire_timeout(timeout: Duration) => acquire_timeout = timeout;

        /// How long the rows of a key nobody holds stay (default an hour;
        /// `None` keeps them forever, as versions before this one did). A
        /// sweep after releases deletes them; a key that comes back starts
        /// its fence at the server's clock in microseconds, above every
        /// token it had (docs/storage.md). URL option
        /// `?idle_window=30s|10m|1h|never`.
        with_idle_window(window: Option<Duration>) => idle_window = window;
    }

    /// How long idle rows stay; `None`: forever.
    pub fn idle_window(&self) -> Option<Duration> {
        self.idle_window
    }

    /// The configured table name, as given.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The configured pooler.
    pub fn pooler(&self) -> Pooler {
        self.pooler
    }

    /// The configured listen URL, if any.
    pub fn listen_url(&self) -> Option<&str> {
        self.listen_url.as_deref()
    }

    /// Takes this store's own options out of `url`'s query string
    /// (`max_connections`, `idle_timeout`, `acquire_timeout`) and applies
    /// them; the rest of the URL stays for [`parse_store_url`](super::parse_store_url).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a malformed value.
    pub(super) fn split_url_options(mut self, url: &str) -> crate::error::Result<(String, Self)> {
        let Some((base, query)) = url.split_once('?') else {
            return Ok((url.to_owned(), self));
        };
        let mut rest = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("max_connections", v)) => {
                    self.max_connections = v.parse().map_err(|_| {
                        crate::error::Error::invalid(
                            "max_connections",
                            format!("must be a whole number, got {v:?}"),
                        )
                    })?;
                }
                Some(("idle_timeout", v)) => self.idle_timeout = url_duration("idle_timeout", v)?,
                Some(("idle_window", v)) => {
                    self.idle_window = crate::scheme::parse_idle_window(v)?;
                }
                Some(("acquire_timeout", v)) => {
                    self.acquire_timeout = url_duration("acquire_timeout", v)?;
                }
                _ => rest.push(pair),
            }
        }
        let url = if rest.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", rest.join("&"))
        };
        Ok((url, self))
    }
}

/// A URL option's duration: whole milliseconds (`500ms`) or seconds (`5s`).
fn url_duration(what: &'static str, value: &str) -> crate::error::Result<Duration> {
    let parsed = if let Some(ms) = value.strip_suffix("ms") {
        ms.parse().ok().map(Duration::from_millis)
    } else if let Some(s) = value.strip_suffix('s') {
        s.parse().ok().map(Duration::from_secs)
    } else {
        None
    };
    parsed.ok_or_else(|| {
        crate::error::Error::invalid(
            what,
            format!("must be whole milliseconds or seconds like 500ms or 5s, got {value:?}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_options_are_taken_out_of_the_url() {
        let (url, o) = PostgresOptions::new()
            .split_url_options(
                "postgres://u@h/db?sslmode=disable&max_connections=3&idle_timeout=500ms&acquire_timeout=2s",
            )
            .unwrap();
        assert_eq!(url, "postgres://u@h/db?sslmode=disable");
        assert_eq!(o.max_connections, 3);
        assert_eq!(o.idle_timeout, Duration::from_millis(500));
        assert_eq!(o.acquire_timeout, Duration::from_secs(2));
        let (url, o) = PostgresOptions::new()
            .split_url_options("postgres://u@h/db")
            .unwrap();
        assert_eq!(url, "postgres://u@h/db");
        assert_eq!(o.max_connections, DEFAULT_MAX_CONNECTIONS);
    }

    #[test]
    fn bad_url_options_are_named() {
        for (url, message) in [
            ("postgres://h/db?max_connections=many", "invalid max_connections: must be a whole number, got \"many\""),
            ("postgres://h/db?idle_timeout=5", "invalid idle_timeout: must be whole milliseconds or seconds like 500ms or 5s, got \"5\""),
            ("postgres://h/db?acquire_timeout=1.5s", "invalid acquire_timeout: must be whole milliseconds or seconds like 500ms or 5s, got \"1.5s\""),
        ] {
            let e = PostgresOptions::new().split_url_options(url).unwrap_err();
            assert_eq!(e.to_string(), message);
        }
    }

    #[test]
    fn debug_output_hides_the_listen_url_password() {
        let options = PostgresOptions::new().with_listen_url("postgres://app:hunter22@db/orders");
        let text = format!("{options:?}");
        assert!(!text.contains("hunter22"), "{text}");
        assert!(text.contains("postgres://app:***@db/orders"), "{text}");
    }
}
