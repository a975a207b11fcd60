//! Every store's URL query options, as plain data on the lowest floor:
//! [`Scheme::parse`](super::Scheme::parse) refuses an unknown option before
//! any I/O with these tables, and each store's `options.rs` reads its own
//! from here, so that neither the parser imports a store nor a store the
//! parser's callers. A store's options stay listed whether or not its
//! feature is on (a URL of a store left out never gets as far as them).

use std::time::Duration;

use crate::error::{Error, Result};

/// SQLite's own options (`synchronous=full|normal`, `idle_window=1h`).
pub(crate) const SQLITE_OPTIONS: &[&str] = &["synchronous", "idle_window"];

/// PostgreSQL's options that are leasehold's, not sqlx's.
pub(crate) const POSTGRES_OPTIONS: &[&str] = &[
    "pooler",
    "listen_url",
    "max_connections",
    "idle_timeout",
    "acquire_timeout",
    "idle_window",
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
pub(crate) const REDIS_OPTIONS: &[&str] =
    &["prefix", "min_replicas", "max_connections", "idle_window"];

/// What redis-rs 1.8 reads from a URL's query: the protocol, and for a
/// `redis+unix://` socket the database and credentials.
pub(crate) const REDIS_DRIVER_OPTIONS: &[&str] = &["protocol", "db", "user", "pass"];

/// The query options of a `mongodb://` URL that are leasehold's (the rest
/// go to the driver, which refuses the ones it does not know).
pub(crate) const MONGODB_OPTIONS: &[&str] = &["idle_window"];

/// The options an etcd URL takes (besides `listen`, which the core reads).
pub(crate) const ETCD_OPTIONS: &[&str] = &[
    "prefix",
    "ca_file",
    "cert_file",
    "key_file",
    "domain",
    "idle_window",
];

/// Checks the value of the Redis URL option `name` before any I/O (the
/// prefix is checked with the other options, when the store is opened).
pub(crate) fn check_redis_option(name: &str, value: &str) -> Result<()> {
    match name {
        "min_replicas" => redis_count::<u32>(name, value).map(drop),
        "max_connections" => redis_count::<usize>(name, value).map(drop),
        "idle_window" => parse_idle_window(value).map(drop),
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

/// Reads the URL option `idle_window`: a whole number of `ms`, `s`, `m`
/// or `h`, or `never` (records are kept forever, as before). `None`
/// means never.
///
/// # Errors
/// [`Error::InvalidInput`] for anything else, or a zero window.
pub fn parse_idle_window(value: &str) -> Result<Option<Duration>> {
    if value == "never" {
        return Ok(None);
    }
    let split = value
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(value.len());
    let (digits, unit) = value.split_at(split);
    let scale = match unit {
        "ms" => Some(1),
        "s" => Some(1_000),
        "m" => Some(60_000),
        "h" => Some(3_600_000),
        _ => None,
    };
    let millis = scale
        .zip(digits.parse::<u64>().ok())
        .and_then(|(scale, n)| n.checked_mul(scale));
    match millis {
        Some(0) => Err(Error::invalid(
            "idle_window",
            "must be above zero (use never to keep records forever)",
        )),
        Some(ms) => Ok(Some(Duration::from_millis(ms))),
        None => Err(Error::invalid(
            "idle_window",
            format!(
                "must be a whole number of ms, s, m or h (like 30s or 1h), or never; got {value:?}"
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_read_in_their_units_or_never() {
        let ok = |v: &str| parse_idle_window(v).unwrap();
        assert_eq!(ok("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(ok("30s"), Some(Duration::from_secs(30)));
        assert_eq!(ok("10m"), Some(Duration::from_secs(600)));
        assert_eq!(ok("2h"), Some(Duration::from_secs(7200)));
        assert_eq!(ok("never"), None);
        for bad in [
            "",
            "5",
            "1d",
            "-1s",
            "1.5s",
            "s",
            "0s",
            "99999999999999999h",
        ] {
            let e = parse_idle_window(bad).unwrap_err().to_string();
            assert!(e.contains("idle_window"), "{bad:?}: {e}");
        }
    }
}
