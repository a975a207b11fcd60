//! A store URL: sqlx's connect options plus leasehold's own query options
//! (`pooler`, `listen_url`), which sqlx would ignore with a warning.

use std::str::FromStr;

use sqlx::postgres::PgConnectOptions;

use super::pooler::Pooler;
use super::PostgresOptions;
use crate::error::{Error, Result};

/// Splits a store URL into sqlx's connect options and `options` updated
/// with the URL's `pooler=none|transaction` and `listen_url=URL`
/// (percent-encode a listen URL that has its own `&` or `#`).
///
/// Behind a transaction pooler the connect options leave out the
/// `extra_float_digits` startup parameter, which PgBouncer rejects unless it
/// is in its `ignore_startup_parameters`.
///
/// ```
/// use leasehold::backends::postgres::{parse_store_url, Pooler, PostgresOptions};
/// let (connect, options) = parse_store_url(
///     "postgres://app@pgbouncer:6432/app?pooler=transaction&listen_url=postgres://app@db:5432/app",
///     PostgresOptions::new(),
/// )?;
/// assert_eq!(connect.get_port(), 6432);
/// assert_eq!(options.pooler(), Pooler::Transaction);
/// assert_eq!(options.listen_url(), Some("postgres://app@db:5432/app"));
/// # Ok::<(), leasehold::Error>(())
/// ```
///
/// # Errors
/// [`Error::InvalidInput`] for a URL that is not `postgres://` or
/// `postgresql://`, that sqlx cannot parse, or with a bad `pooler` value or
/// listen URL. The message leaves the URL out: it may carry a password.
pub fn parse_store_url(
    url: &str,
    mut options: PostgresOptions,
) -> Result<(PgConnectOptions, PostgresOptions)> {
    check_scheme("store url", url)?;
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "pooler" => {
                options.pooler =
                    Pooler::from_url_value(&percent_decode(value)?).ok_or_else(|| {
                        Error::invalid(
                            "store url",
                            format!("pooler must be none or transaction, got {value:?}"),
                        )
                    })?;
            }
            "listen_url" => options.listen_url = Some(percent_decode(value)?),
            _ => kept.push(pair),
        }
    }
    let sqlx_url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    let mut connect = PgConnectOptions::from_str(&sqlx_url)
        .map_err(|e| Error::invalid_from("store url", "not a PostgreSQL URL", e))?;
    if options.pooler == Pooler::Transaction {
        connect = connect.extra_float_digits(None);
    }
    if let Some(listen) = &options.listen_url {
        parse_listen_url(listen)?;
    }
    Ok((connect, options))
}

/// Parses a listen URL: always a direct (or session-mode) connection.
pub(super) fn parse_listen_url(url: &str) -> Result<PgConnectOptions> {
    check_scheme("listen url", url)?;
    PgConnectOptions::from_str(url)
        .map_err(|e| Error::invalid_from("listen url", "not a PostgreSQL URL", e))
}

fn check_scheme(what: &'static str, url: &str) -> Result<()> {
    if crate::scheme::Scheme::of(url) == Some(crate::scheme::Scheme::Postgres) {
        Ok(())
    } else {
        Err(Error::invalid(
            what,
            "not a PostgreSQL URL: must start with postgres:// or postgresql://",
        ))
    }
}

/// Decodes `%XX` escapes (and `+` as a space, as in any query string).
fn percent_decode(value: &str) -> Result<String> {
    let bad = || Error::invalid("store url", "a query option has a bad %-escape");
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3).ok_or_else(bad)?;
                let hex = std::str::from_utf8(hex).map_err(|_| bad())?;
                out.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_options_are_taken_out_and_the_rest_kept() {
        let (connect, options) = parse_store_url(
            "postgres://u@h:6432/db?application_name=a&pooler=transaction&listen_url=postgres%3A%2F%2Fu%40h%3A5432%2Fdb%3Fsslmode%3Ddisable",
            PostgresOptions::new(),
        )
        .unwrap();
        assert_eq!(connect.get_application_name(), Some("a"));
        assert_eq!(options.pooler(), Pooler::Transaction);
        assert_eq!(
            options.listen_url(),
            Some("postgres://u@h:5432/db?sslmode=disable")
        );
        let (_, options) = parse_store_url("postgres://u@h/db", PostgresOptions::new()).unwrap();
        assert_eq!(options.pooler(), Pooler::None);
        assert_eq!(options.listen_url(), None);
    }

    #[test]
    fn bad_options_are_named_without_the_url() {
        let problem = |url: &str| {
            parse_store_url(url, PostgresOptions::new())
                .unwrap_err()
                .to_string()
        };
        assert!(problem("postgres://u:secret@h/db?pooler=statement")
            .contains("pooler must be none or transaction, got \"statement\""));
        let e = problem("postgres://u:secret@h/db?listen_url=redis://x");
        assert!(e.starts_with("invalid listen url: "), "{e}");
        assert!(!e.contains("secret"), "{e}");
        assert!(problem("postgres://h/db?listen_url=%zz").contains("%-escape"));
        assert!(problem("mysql://h/db").starts_with("invalid store url: "));
    }
}
