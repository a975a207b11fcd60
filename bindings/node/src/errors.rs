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
    let ms = d.as_millis();
    let rounded = if d.as_nanos() % 1_000_000 == 0 { ms } else { ms + 1 };
    u64::try_from(rounded).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_errors_carry_holder_and_retry_after() {
        let error = Error::Busy {
            key: "k".into(),
            holder: "host:1".into(),
            remaining: Duration::from_micros(1500),
        };
        let text = to_js(error, None).reason;
        let record: Value = serde_json::from_str(text.strip_prefix(TAG).unwrap()).unwrap();
        assert_eq!(record["code"], "LEASEHOLD_BUSY");
        assert_eq!(record["holder"], "host:1");
        assert_eq!(record["retryAfterMs"], 2);
        assert_eq!(record["retryable"], true);
    }

    #[test]
    fn input_errors_are_not_retryable() {
        let text = js(Error::invalid("key", "must not be empty")).reason;
        let record: Value = serde_json::from_str(text.strip_prefix(TAG).unwrap()).unwrap();
        assert_eq!(record["code"], "LEASEHOLD_INVALID_INPUT");
        assert_eq!(record["retryable"], false);
        assert!(record.get("holder").is_none());
    }
}
