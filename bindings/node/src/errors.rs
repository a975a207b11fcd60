//! Rust errors to JS: a napi error whose message is a tagged JSON record the
//! JS wrapper turns into an `Error` with `code`, `retryable`, `holder` and
//! `retryAfterMs` (napi-rs cannot give an `async fn`'s rejection a custom
//! `code` itself).

use std::time::Duration;

use leasehold::Error;
use napi::Status;
use serde_json::{json, Map, Value};

/// The prefix the JS wrapper recognises; anything else is rethrown as is.
const TAG: &str = "LEASEHOLD_ERROR:";

/// The JS error code for a library error.
fn code(error: &Error) -> &'static str {
    match error {
        Error::InvalidInput { .. } => "LEASEHOLD_INVALID_INPUT",
        Error::Busy { .. } => "LEASEHOLD_BUSY",
        Error::Timeout { .. } => "LEASEHOLD_TIMEOUT",
        Error::Cancelled { .. } => "LEASEHOLD_CANCELLED",
        Error::LeaseLost { .. } => "LEASEHOLD_LOST",
        // One key is one lock: the key is a lock of another kind (a
        // semaphore's key taken as a mutex, say). The program's mistake.
        Error::KindMismatch { .. } => "LEASEHOLD_KIND_MISMATCH",
        // A permanent store error is still "the store cannot serve this";
        // `retryable: false` tells it apart from an outage.
        _ => "LEASEHOLD_UNAVAILABLE",
    }
}

/// The core's words for a wait behind this process's own lease; JS code
/// holds leases, not guards.
const GUARD_WORDS: &str = "(a guard of this same process holds it: release or drop that guard)";
const LEASE_WORDS: &str =
    "(a lease of this same process holds it: release it, or let its withLock callback finish)";

/// Where the MongoDB driver's server-selection error starts: after it comes
/// a Rust debug rendering of the topology, no use to a Node user.
const SELECTION_DUMP: &str = "Kind: Server selection timeout";

/// The message in Node's words: the guard wording and the MongoDB driver's
/// topology dump rewritten, each server tried kept with its error.
fn node_words(text: String) -> String {
    let text = text.replace(GUARD_WORDS, LEASE_WORDS);
    if let Some(name) = missing_srv_record(&text) {
        let at = text.find("Kind: ").unwrap_or(text.len());
        return format!(
            "{}the DNS has no SRV record {name} (a mongodb+srv:// URL needs one: check the host name)",
            &text[..at]
        );
    }
    let Some(at) = text.find(SELECTION_DUMP) else {
        return text;
    };
    let servers = selection_servers(&text[at..]);
    let tried = if servers.is_empty() {
        String::new()
    } else {
        format!("; tried {}", servers.join(", "))
    };
    format!(
        "{}no MongoDB server answered within the server selection timeout \
         (serverSelectionTimeoutMS in the URL, default 3000 ms){tried}",
        &text[..at]
    )
}

/// The SRV record name of the MongoDB driver's "no records found" DNS error.
fn missing_srv_record(text: &str) -> Option<&str> {
    const QUERY: &str = "no records found for Query { name: Name(\"";
    let start = text.find(QUERY)? + QUERY.len();
    let name = &text[start..];
    let name = &name[..name.find('"')?];
    Some(name.strip_suffix('.').unwrap_or(name))
}

/// `host:port (its error)` for each server of a server-selection dump.
fn selection_servers(dump: &str) -> Vec<String> {
    const ADDRESS: &str = "Address: ";
    const ERROR: &str = "Error: Kind: ";
    let mut servers = Vec::new();
    let mut rest = dump;
    while let Some(start) = rest.find(ADDRESS) {
        rest = &rest[start + ADDRESS.len()..];
        let address = &rest[..rest.find(',').unwrap_or(rest.len())];
        let entry = &rest[..rest.find(ADDRESS).unwrap_or(rest.len())];
        let error = entry.find(ERROR).map(|e| {
            let error = &entry[e + ERROR.len()..];
            &error[..error.find(", labels:").unwrap_or(error.len())]
        });
        servers.push(match error {
            Some(error) => format!("{address} ({error})"),
            None => address.to_owned(),
        });
    }
    servers
}

/// The full message: the error and its causes, as the CLI prints them, in
/// Node's words.
fn message(error: &Error) -> String {
    node_words(leasehold::error_chain(error))
}

/// Who holds a contested key and the longest its lease can still last:
/// from a busy answer, or the last one a timed-out wait saw (none if the
/// wait ended before reaching the store).
fn contention(error: &Error) -> Option<(&str, Duration)> {
    match error {
        Error::Busy {
            holder, remaining, ..
        } => Some((holder, *remaining)),
        Error::Timeout {
            holder: Some(holder),
            remaining: Some(remaining),
            ..
        } => Some((holder, *remaining)),
        _ => None,
    }
}

/// Converts a library error.
pub(crate) fn js(error: Error) -> napi::Error {
    let mut record = Map::new();
    record.insert("code".into(), json!(code(&error)));
    record.insert("message".into(), json!(message(&error)));
    record.insert("retryable".into(), json!(error.is_retryable()));
    if let Some((holder, remaining)) = contention(&error) {
        record.insert("holder".into(), json!(holder));
        record.insert("retryAfterMs".into(), json!(ceil_millis(remaining)));
    }
    napi::Error::new(
        Status::GenericFailure,
        format!("{TAG}{}", Value::Object(record)),
    )
}

/// Milliseconds rounded up, so "retry after" never undershoots.
pub(crate) fn ceil_millis(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}
