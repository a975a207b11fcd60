//! Store URLs with their credentials taken out, for everything that prints
//! one (headers, errors, logs, JSON): the password of `user:password@` and
//! the values of secret query parameters (`password=`, `token=`,
//! `secret=`, ...) become [`PLACEHOLDER`].
//!
//! The URL is not parsed by a driver's rules but taken apart by hand, so
//! that a URL no driver accepts (a reserved character left unencoded in the
//! password, no scheme at all) is still redacted: when in doubt, more is
//! hidden, never less.
//!
//! ```
//! use leasehold::{redact_secrets, redact_url};
//!
//! assert_eq!(
//!     redact_url("postgres://app:s3cret@db1:5432/orders?sslmode=require&password=s3cret"),
//!     "postgres://app:***@db1:5432/orders?sslmode=require&password=***"
//! );
//! assert_eq!(redact_url("mongodb://app:p%40ss@h1,h2/locks"), "mongodb://app:***@h1,h2/locks");
//! // A driver's message that echoes the password loses it too.
//! assert_eq!(
//!     redact_secrets("auth failed for app:s3cret", "redis://app:s3cret@cache"),
//!     "auth failed for app:***"
//! );
//! ```

/// What a password or secret parameter value is replaced with.
pub const PLACEHOLDER: &str = "***";

/// Secrets shorter than this are masked inside a URL but not searched for in
/// free text: replacing every `a` of a message would make it unreadable, and
/// a password that short protects nothing anyway.
const MIN_SCRUBBED_SECRET: usize = 3;

/// `url` with the password of its userinfo and the values of its secret
/// query parameters replaced by [`PLACEHOLDER`]; the scheme, user, hosts,
/// path and other parameters are kept so the URL still says which store it
/// names. Anything that is not a URL is redacted as far as it looks like one.
pub fn redact_url(url: &str) -> String {
    let parts = Parts::of(url);
    let mut out = String::with_capacity(url.len());
    out.push_str(parts.scheme);
    if let Some(userinfo) = parts.userinfo {
        match userinfo.split_once(':') {
            Some((user, _password)) => {
                out.push_str(user);
                out.push(':');
                out.push_str(PLACEHOLDER);
            }
            None => out.push_str(userinfo),
        }
        out.push('@');
    }
    out.push_str(&redact_query(parts.rest));
    out
}

/// `text` (a driver's error message, a log line) with `url` replaced by its
/// redacted form and every secret of `url` (the password and the values of
/// secret query parameters, as written and percent-decoded) replaced by
/// [`PLACEHOLDER`].
pub fn redact_secrets(text: &str, url: &str) -> String {
    let mut out = if url.is_empty() {
        text.to_owned()
    } else {
        text.replace(url, &redact_url(url))
    };
    for secret in secrets(url) {
        out = out.replace(&secret, PLACEHOLDER);
    }
    out
}

/// Whether `text` contains a secret of `url` (one long enough to search for).
pub(crate) fn reveals_secret(text: &str, url: &str) -> bool {
    secrets(url).iter().any(|s| text.contains(s.as_str()))
}

/// The secrets of `url` worth searching for in free text, longest first so
/// that a secret containing another is replaced whole.
fn secrets(url: &str) -> Vec<String> {
    let parts = Parts::of(url);
    let mut raw: Vec<&str> = Vec::new();
    if let Some((_, password)) = parts.userinfo.and_then(|u| u.split_once(':')) {
        raw.push(password);
    }
    raw.extend(
        query_pairs(parts.rest)
            .filter(|(key, _)| is_secret_key(key))
            .map(|(_, value)| value),
    );
    let mut found: Vec<String> = Vec::new();
    // The secrets of a URL inside the URL (PostgreSQL's `listen_url=`).
    for (_, value) in query_pairs(parts.rest) {
        let value = percent_decode(value);
        if value.contains("://") {
            for secret in secrets(&value) {
                if !found.contains(&secret) {
                    found.push(secret);
                }
            }
        }
    }
    for secret in raw {
        for form in [secret.to_owned(), percent_decode(secret)] {
            if form.len() >= MIN_SCRUBBED_SECRET && !found.contains(&form) {
                found.push(form);
            }
        }
    }
    found.sort_by_key(|s| std::cmp::Reverse(s.len()));
    found
}

/// A URL taken apart as far as redaction needs.
struct Parts<'a> {
    /// `postgres://`, or empty for text without a scheme.
    scheme: &'a str,
    /// Everything before the `@` that ends the userinfo, if there is one.
    userinfo: Option<&'a str>,
    /// Hosts, path, query and fragment.
    rest: &'a str,
}

impl<'a> Parts<'a> {
    fn of(url: &'a str) -> Self {
        let (scheme, after) = match url.find("://") {
            Some(i) if is_scheme(&url[..i]) => url.split_at(i + 3),
            _ => ("", url),
        };
        match userinfo_end(after) {
            Some(at) => Parts {
                scheme,
                userinfo: Some(&after[..at]),
                rest: &after[at + 1..],
            },
            None => Parts {
                scheme,
                userinfo: None,
                rest: after,
            },
        }
    }
}

fn is_scheme(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// Where the userinfo ends: the last `@` before the query, as the MongoDB
/// driver reads it (a superset of what the URL standard reads, where the
/// authority also ends at `/`: an unencoded `/` in a password is covered).
/// With no `@` before the query, a `?` or `#` may sit unencoded in the
/// password itself (`redis://:pa?ss@host`); the last `@` then ends the
/// userinfo unless what precedes it looks like a query (has a `=`), as in
/// `postgres://host/db?user=me@example.com`.
fn userinfo_end(after_scheme: &str) -> Option<usize> {
    let query = after_scheme.find(['?', '#']).unwrap_or(after_scheme.len());
    if let Some(at) = after_scheme[..query].rfind('@') {
        return Some(at);
    }
    let at = after_scheme.rfind('@')?;
    (!after_scheme[..at].contains('=')).then_some(at)
}

/// `rest` with the values of its secret query parameters replaced.
fn redact_query(rest: &str) -> String {
    let Some((before, query)) = rest.split_once('?') else {
        return rest.to_owned();
    };
    let (query, fragment) = match query.split_once('#') {
        Some((q, f)) => (q, Some(f)),
        None => (query, None),
    };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((key, _)) if is_secret_key(key) => format!("{key}={PLACEHOLDER}"),
            // A URL inside the URL (PostgreSQL's `listen_url=`), redacted
            // the same way (shown decoded).
            Some((key, value)) if percent_decode(value).contains("://") => {
                format!("{key}={}", redact_url(&percent_decode(value)))
            }
            _ => pair.to_owned(),
        })
        .collect();
    let mut out = format!("{before}?{}", pairs.join("&"));
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    out
}

/// The `key=value` pairs of the query in `rest`.
fn query_pairs(rest: &str) -> impl Iterator<Item = (&str, &str)> {
    let query = rest.split_once('?').map_or("", |(_, q)| q);
    let query = query.split_once('#').map_or(query, |(q, _)| q);
    query.split('&').filter_map(|pair| pair.split_once('='))
}

/// Whether a query parameter carries a credential: any name with `pass`,
/// `pwd`, `secret`, `token`, `credential`, `apikey`/`api_key`, `private`,
/// `signature` or `auth` in it (MongoDB's `authMechanismProperties` can
/// carry an AWS session token), except the two MongoDB names that only
/// choose how to log in. Compared percent-decoded and case-blind.
fn is_secret_key(key: &str) -> bool {
    const SECRET: &[&str] = &[
        "pass",
        "pwd",
        "secret",
        "token",
        "credential",
        "apikey",
        "api_key",
        "private",
        "signature",
        "auth",
    ];
    const NOT_SECRET: &[&str] = &["authsource", "authmechanism"];
    let key = percent_decode(key).to_ascii_lowercase();
    !NOT_SECRET.contains(&key.as_str()) && SECRET.iter().any(|s| key.contains(s))
}

/// `%XX` sequences decoded; anything malformed kept as written.
fn percent_decode(s: &str) -> String {
    String::from_utf8_lossy(&crate::percent::percent_decode_bytes(s)).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every case: the input, its secret, and the redacted form.
    const CASES: &[(&str, &str, &str)] = &[
        (
            "postgres://app:hunter22@db:5432/orders",
            "hunter22",
            "postgres://app:***@db:5432/orders",
        ),
        (
            "postgresql://app:hunter22@db/orders?sslmode=require",
            "hunter22",
            "postgresql://app:***@db/orders?sslmode=require",
        ),
        // Redis: password only, and ACL user + password.
        ("redis://:hunter22@cache:6379/2", "hunter22", "redis://:***@cache:6379/2"),
        (
            "redis://locker:hunter22@cache?prefix=app",
            "hunter22",
            "redis://locker:***@cache?prefix=app",
        ),
        // MongoDB with several hosts and options.
        (
            "mongodb://app:hunter22@h1:27017,h2:27018,h3/locks?replicaSet=rs0&authSource=admin",
            "hunter22",
            "mongodb://app:***@h1:27017,h2:27018,h3/locks?replicaSet=rs0&authSource=admin",
        ),
        // Percent-encoded reserved characters in the password.
        (
            "postgres://app:p%40ss%3Aw%2Frd@db/orders",
            "p%40ss%3Aw%2Frd",
            "postgres://app:***@db/orders",
        ),
        // Unencoded `@`, `:` and `/` in the password: no driver accepts it,
        // the message about it must still not show it.
        (
            "postgres://app:p@ss:w/rd@db/orders",
            "p@ss:w/rd",
            "postgres://app:***@db/orders",
        ),
        // Unencoded `?` and `#` in the password.
        ("redis://:hun?ter#22@cache", "hun?ter#22", "redis://:***@cache"),
        // A password with a colon: everything after the user's colon.
        ("redis://u:a:b:c@cache", "a:b:c", "redis://u:***@cache"),
        // Secret query parameters, in any case and percent-encoded names.
        (
            "postgres://db/orders?user=app&password=hunter22&sslmode=disable",
            "hunter22",
            "postgres://db/orders?user=app&password=***&sslmode=disable",
        ),
        (
            "redis://cache?pass=hunter22",
            "hunter22",
            "redis://cache?pass=***",
        ),
        (
            "mongodb://h/db?authMechanism=MONGODB-AWS&authMechanismProperties=AWS_SESSION_TOKEN:hunter22",
            "hunter22",
            "mongodb://h/db?authMechanism=MONGODB-AWS&authMechanismProperties=***",
        ),
        ("x://h?Api%4Bey=hunter22&TOKEN=hunter22", "hunter22", "x://h?Api%4Bey=***&TOKEN=***"),
        (
            "mongodb://h/db?tlsCertificateKeyFilePassword=hunter22#frag",
            "hunter22",
            "mongodb://h/db?tlsCertificateKeyFilePassword=***#frag",
        ),
        ("s3://h?client_secret=hunter22", "hunter22", "s3://h?client_secret=***"),
        // A listen URL past a pooler, inside the store URL, as written and
        // percent-encoded.
        (
            "postgres://app@pgbouncer/app?pooler=transaction&listen_url=postgres://app:hunter22@db/app",
            "hunter22",
            "postgres://app@pgbouncer/app?pooler=transaction&listen_url=postgres://app:***@db/app",
        ),
        (
            "postgres://app@pgbouncer/app?listen_url=postgres%3A%2F%2Fapp%3Ahunter22%40db%2Fapp",
            "hunter22",
            "postgres://app@pgbouncer/app?listen_url=postgres://app:***@db/app",
        ),
        // No scheme at all, or a malformed one.
        ("app:hunter22@db/orders", "hunter22", "app:***@db/orders"),
        ("postgres:/app:hunter22@db", "hunter22", "postgres:***@db"),
        ("", "", ""),
    ];

    #[test]
    fn hostile_urls_lose_their_secrets() {
        for (url, secret, redacted) in CASES {
            let got = redact_url(url);
            assert_eq!(&got, redacted, "{url}");
            if !secret.is_empty() {
                assert!(!got.contains(secret), "{url} -> {got}");
                assert!(!got.contains(&percent_decode(secret)), "{url} -> {got}");
            }
        }
    }

    #[test]
    fn urls_without_secrets_are_kept_as_written() {
        for url in [
            "sqlite:///var/lib/app/locks.db",
            "sqlite:///tmp/a@b.db",
            "memory://",
            "redis://cache:6379/0?prefix=app&protocol=resp3",
            "redis+unix:///run/redis.sock",
            "postgres://app@db/orders",
            "postgres://db:5432/orders?user=me@example.com&sslmode=require",
            "mongodb://h1,h2/locks?authSource=admin&authMechanism=SCRAM-SHA-256",
            "not a url at all",
        ] {
            assert_eq!(redact_url(url), url);
        }
    }

    #[test]
    fn messages_lose_every_form_of_the_secret() {
        let url = "postgres://app:p%40ss%2Fword@db/orders?password=tok3n";
        let message = format!(
            "cannot connect to {url}: user app with p@ss/word or p%40ss%2Fword or tok3n refused"
        );
        assert_eq!(
            redact_secrets(&message, url),
            "cannot connect to postgres://app:***@db/orders?password=***: \
             user app with *** or *** or *** refused"
        );
        assert!(reveals_secret(&message, url));
        assert!(!reveals_secret(&redact_secrets(&message, url), url));
    }

    #[test]
    fn a_listen_url_inside_the_store_url_loses_its_secret_in_messages() {
        let url = "postgres://app@pgbouncer/app?pooler=transaction&listen_url=postgres://app:s3cret@db/app";
        let message = "password authentication failed: app:s3cret";
        assert!(reveals_secret(message, url));
        assert_eq!(
            redact_secrets(message, url),
            "password authentication failed: app:***"
        );
    }

    #[test]
    fn a_secret_containing_another_is_replaced_whole() {
        let url = "redis://u:abcdef@h?token=bcd";
        assert_eq!(redact_secrets("x abcdef y bcd", url), "x *** y ***");
    }

    #[test]
    fn tiny_secrets_are_masked_in_urls_but_not_searched_in_text() {
        let url = "redis://:p@h";
        assert_eq!(redact_url(url), "redis://:***@h");
        assert_eq!(redact_secrets("pool of pubsub", url), "pool of pubsub");
    }

    #[test]
    fn malformed_percent_escapes_are_kept() {
        assert_eq!(percent_decode("a%4"), "a%4");
        assert_eq!(percent_decode("a%zz%41"), "a%zzA");
    }
}
