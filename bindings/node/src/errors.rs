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

/// Who holds a contested key and for how long, when known.
pub(crate) struct Contention {
    pub holder: String,
    pub remaining: Duration,
}

/// The JS error code for a library error.
fn code(error: &Error) -> &'static str {
    match error {
        Error::InvalidInput { .. } => "LEASEHOLD_INVALID_INPUT",
        Error::Busy { .. } => "LEASEHOLD_BUSY",
        Error::Timeout { .. } => "LEASEHOLD_TIMEOUT",
        Error::Cancelled { .. } => "LEASEHOLD_CANCELLED",
        Error::LeaseLost { .. } => "LEASEHOLD_LOST",
        // A permanent store error is still "the store cannot serve this";
        // `retryable: false` tells it apart from an outage.
        _ => "LEASEHOLD_UNAVAILABLE",
    }
}

/// The full message: the error and its causes, as the CLI prints them.
fn message(error: &Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Converts a library error, adding who holds the key when the caller found
/// out (a timeout carries no holder of its own).
pub(crate) fn to_js(error: Error, contention: Option<Contention>) -> napi::Error {
    let mut record = Map::new();
    record.insert("code".into(), json!(code(&error)));
    record.insert("message".into(), json!(message(&error)));
    record.insert("retryable".into(), json!(error.is_retryable()));
    let contention = match &error {
        Error::Busy {
            holder, remaining, ..
        } => Some(Contention {
            holder: holder.clone(),
            remaining: *remaining,
        }),
        _ => contention,
    };
    if let Some(c) = contention {
        record.insert("holder".into(), json!(c.holder));
        record.insert("retryAfterMs".into(), json!(ceil_millis(c.remaining)));
    }
    napi::Error::new(
        Status::GenericFailure,
        format!("{TAG}{}", Value::Object(record)),
    )
}

/// Shorthand for errors without contention details.
pub(crate) fn js(error: Error) -> napi::Error {
    to_js(error, None)
}

/// Milliseconds rounded up, so "retry after" never undershoots.
pub(crate) fn ceil_millis(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}
