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
