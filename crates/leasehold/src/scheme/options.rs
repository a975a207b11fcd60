//! Every store's URL query options, as plain data on the lowest floor:
//! [`Scheme::parse`](super::Scheme::parse) refuses an unknown option before
//! any I/O with these tables, and each store's `options.rs` reads its own
//! from here, so that neither the parser imports a store nor a store the
//! parser's callers. A store's options stay listed whether or not its
//! feature is on (a URL of a store left out never gets as far as them).

use crate::error::{Error, Result};

/// SQLite's own option (`synchronous=full|normal`).
pub(crate) const SQLITE_OPTIONS: &[&str] = &["synchronous"];

/// PostgreSQL's options that are leasehold's, not sqlx's.
pub(crate) const POSTGRES_OPTIONS: &[&str] = &[
    "pooler",
    "listen_url",
    "max_connections",
    "idle_timeout",
    "acquire_timeout",
];

/// sqlx's PostgreSQL connection parameters (sqlx-postgres 0.8,
/// `options/parse.rs`), besides `options[NAME]`.
pub(crate) const POSTGRES_DRIVER_OPTIONS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

/// The query options of a `redis://` or `redis+cluster://` URL that are
/// leasehold's (the rest go to the driver, see [`REDIS_DRIVER_OPTIONS`]).
pub(crate) const REDIS_OPTIONS: &[&str] = &["prefix", "min_replicas", "max_connections"];

/// What redis-rs 1.8 reads from a URL's query: the protocol, and for a
/// `redis+unix://` socket the database and credentials.
pub(crate) const REDIS_DRIVER_OPTIONS: &[&str] = &["protocol", "db", "user", "pass"];

/// The options an etcd URL takes (besides `listen`, which the core reads).
pub(crate) const ETCD_OPTIONS: &[&str] = &["prefix", "ca_file", "cert_file", "key_file", "domain"];

/// Checks the value of the Redis URL option `name` before any I/O (the
/// prefix is checked with the other options, when the store is opened).
pub(crate) fn check_redis_option(name: &str, value: &str) -> Result<()> {
    match name {
        "min_replicas" => redis_count::<u32>(name, value).map(drop),
        "max_connections" => redis_count::<usize>(name, value).map(drop),
        _ => Ok(()),
    }
}

/// The whole number a Redis count option (`min_replicas`,
/// `max_connections`) must be: parsed once, by the URL check and by the
/// store's options alike.
pub(crate) fn redis_count<T: std::str::FromStr>(name: &str, value: &str) -> Result<T> {
    value.parse().map_err(|_| {
        let what = if name == "min_replicas" {
            "replicas"
        } else {
            "connections"
        };
        Error::invalid(
            "store url",
            format!("{name} must be a whole number of {what}, got {value:?}"),
        )
    })
}
