//! The core's policy, handed to the JS side so it is written once: the
//! defaults (lease length, release bound) and the problem+json answers of
//! `leasehold::http`, which `lib/problem.js` and `express.js` use instead
//! of copies.

use std::time::Duration;

use leasehold::http::problem::{self, Problem};
use leasehold::http::{LimitStatus, DEFAULT_STORE_TIMEOUT};
use leasehold::time::DEFAULT_TTL;
use leasehold::Error;
use napi_derive::napi;

use crate::errors::js;

/// Lease length when the caller does not choose one (the core's
/// `DEFAULT_TTL`), in milliseconds.
#[napi]
pub const DEFAULT_TTL_MS: u32 = DEFAULT_TTL.as_millis() as u32;

/// How long a finished response waits for its release before it is sent
/// anyway (the HTTP layer's `DEFAULT_STORE_TIMEOUT`), in milliseconds.
#[napi]
pub const RELEASE_BOUND_MS: u32 = DEFAULT_STORE_TIMEOUT.as_millis() as u32;

/// The media type of every answer the middleware writes itself.
#[napi]
pub const PROBLEM_CONTENT_TYPE: &str = problem::CONTENT_TYPE;
/// `type` of a 409: the resource is locked by another request.
#[napi]
pub const PROBLEM_LOCKED: &str = problem::LOCKED;
/// `type` of the 503 (or 429) of a concurrency limit.
#[napi]
pub const PROBLEM_CONCURRENCY_LIMIT: &str = problem::LIMITED;
/// `type` of a 503: the lock store failed.
#[napi]
pub const PROBLEM_STORE_UNAVAILABLE: &str = problem::STORE_UNAVAILABLE;
/// `type` of a 400: the derived key is not a valid lock key.
#[napi]
pub const PROBLEM_INVALID_KEY: &str = problem::INVALID_KEY;

/// One answer, ready to write: the status, the `Retry-After` seconds and
/// the body's wait in milliseconds (both absent when there is no hint),
/// and the problem document as JSON text.
#[napi(object)]
pub struct ProblemAnswer {
    pub status: u16,
    pub retry_after_secs: Option<f64>,
    pub retry_after_ms: Option<f64>,
    pub body: String,
}

impl From<Problem> for ProblemAnswer {
    fn from(problem: Problem) -> Self {
        // Milliseconds up to 2^53 are exact in a JS number; hints are far
        // below (the ttl bound is 24 h).
        ProblemAnswer {
            status: problem.status().as_u16(),
            retry_after_secs: problem.retry_after_secs().map(|s| s as f64),
            retry_after_ms: problem.retry_after_ms().map(|ms| ms as f64),
            body: problem.to_json(),
        }
    }
}

/// A wait hint from JS: milliseconds, not negative, finite; a fraction
/// rounds up, so "retry after" never undershoots.
fn hint(what: &'static str, ms: f64) -> napi::Result<Duration> {
    if !(ms.is_finite() && ms >= 0.0) {
        return Err(js(Error::invalid(
            what,
            format!("must be a number of milliseconds of at least 0, got {ms}"),
        )));
    }
    // `as` saturates: a hint past u64::MAX ms is "forever" either way.
    Ok(Duration::from_millis(ms.ceil() as u64))
}

/// 409: `key` is held for up to `remaining_ms` more.
#[napi]
pub fn problem_locked(key: String, remaining_ms: f64) -> napi::Result<ProblemAnswer> {
    let remaining = hint("retryAfter", remaining_ms)?;
    Ok(Problem::locked(&key, remaining).into())
}

/// 503 or 429 (`status`): every permit of `key` is taken, the first of them
/// for up to `remaining_ms` more.
#[napi]
pub fn problem_concurrency_limit(
    key: String,
    status: u16,
    remaining_ms: f64,
) -> napi::Result<ProblemAnswer> {
    let status = match status {
        503 => LimitStatus::ServiceUnavailable,
        429 => LimitStatus::TooManyRequests,
        other => {
            return Err(js(Error::invalid(
                "status",
                format!("must be 503 or 429, got {other}"),
            )))
        }
    };
    let remaining = hint("retryAfter", remaining_ms)?;
    Ok(Problem::limited(&key, remaining, status).into())
}

/// 503: the store failed; a `retryable` failure says "retry in 1 s".
#[napi]
pub fn problem_store_unavailable(key: String, retryable: bool) -> ProblemAnswer {
    Problem::unavailable(&key, retryable).into()
}

/// 400: the key derived from the request is not a valid lock key (`why`).
#[napi]
pub fn problem_invalid_key(key: String, why: String) -> ProblemAnswer {
    Problem::invalid_key(&key, why).into()
}
