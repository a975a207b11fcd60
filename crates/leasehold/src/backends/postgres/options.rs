//! [`PostgresOptions`]: how a [`PostgresBackend`](super::PostgresBackend) is set up.

use std::time::Duration;

use super::pooler::Pooler;
use super::sql::DEFAULT_TABLE;
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
    pub(super) acquire_timeout: Duration,
    pub(super) pooler: Pooler,
}

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
            .field("acquire_timeout", &self.acquire_timeout)
            .finish()
    }
}

impl Default for PostgresOptions {
    fn default() -> Self {
        PostgresOptions {
            table: DEFAULT_TABLE.to_owned(),
            migrate: true,
            listen_url: None,
            max_connections: 10,
            acquire_timeout: Duration::from_secs(5),
            pooler: Pooler::None,
        }
    }
}

impl PostgresOptions {
    /// Defaults: table `leasehold_locks`, migrate on connect, no pooler,
    /// `LISTEN` on a pool connection, 10 connections, 5 s to get a connection.
    pub fn new() -> Self {
        Self::default()
    }

    /// The lease table, `table` or `schema.table` of ASCII letters, digits
    /// and `_` (checked by `connect`/`from_pool` before any I/O; quoted in
    /// SQL, so case is kept).
    pub fn with_table(mut self, table: &str) -> Self {
        self.table = table.to_owned();
        self
    }

    /// Whether to create the table on connect (default true).
    pub fn with_migrate(mut self, migrate: bool) -> Self {
        self.migrate = migrate;
        self
    }

    /// Opens the `LISTEN` connection from this URL instead of the pool: for
    /// pools behind PgBouncer in transaction mode, where `LISTEN` does not
    /// work. Point it at the server or a session-mode pool. URL option
    /// `?listen_url=postgres://...`.
    pub fn with_listen_url(mut self, url: &str) -> Self {
        self.listen_url = Some(url.to_owned());
        self
    }

    /// What sits between the store and the server (default
    /// [`Pooler::None`]). [`Pooler::Transaction`] for PgBouncer in
    /// transaction mode: statements go unprepared, and without a listen URL
    /// waiters poll instead of listening. URL option `?pooler=transaction`.
    pub fn with_pooler(mut self, pooler: Pooler) -> Self {
        self.pooler = pooler;
        self
    }

    /// Pool size for [`PostgresBackend::connect_with`] (default 10; at least
    /// 2 unless a listen URL is set or the pooler is
    /// [`Pooler::Transaction`]: the `LISTEN` connection, once a waiter
    /// starts it, is one of them).
    pub fn with_max_connections(mut self, max: u32) -> Self {
        self.max_connections = max;
        self
    }

    /// How long [`PostgresBackend::connect_with`]'s pool waits for a
    /// connection, including connecting to a server that is down, before
    /// failing with [`Error::Unavailable`] (default 5 s).
    pub fn with_acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
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
}

#[cfg(test)]
mod tests {
    use super::PostgresOptions;

    #[test]
    fn debug_output_hides_the_listen_url_password() {
        let options = PostgresOptions::new().with_listen_url("postgres://app:hunter22@db/orders");
        let text = format!("{options:?}");
        assert!(!text.contains("hunter22"), "{text}");
        assert!(text.contains("postgres://app:***@db/orders"), "{text}");
    }
}
