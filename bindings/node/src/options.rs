//! Checks of option values that have no store call of their own to be
//! checked by: `lockRoute` validates its ttl and wait when it is declared,
//! with the library's own bounds, so a bad route fails at start-up.

use std::time::Duration;

use leasehold::time::{validate_ttl, MAX_TTL};
use leasehold::Error;
use napi_derive::napi;

use crate::errors::js;

/// Throws `LEASEHOLD_INVALID_INPUT` unless `ttl_ms` is a valid lease length
/// and `wait_ms` a wait bound of at most 24 h (0: do not wait).
#[napi]
pub fn check_route_options(ttl_ms: f64, wait_ms: f64) -> napi::Result<()> {
    let ttl = Duration::try_from_secs_f64(ttl_ms / 1000.0).map_err(|_| {
        js(Error::invalid(
            "ttl",
            format!("must be milliseconds, got {ttl_ms}"),
        ))
    })?;
    validate_ttl(ttl).map_err(js)?;
    let wait = Duration::try_from_secs_f64(wait_ms / 1000.0).ok();
    if wait.is_none_or(|wait| wait > MAX_TTL) {
        return Err(js(Error::invalid(
            "wait",
            format!("must be at most 24h (0: answer 409 at once), got {wait_ms} ms"),
        )));
    }
    Ok(())
}

/// Throws `LEASEHOLD_INVALID_INPUT` unless `key` is a valid key: lets the
/// `rwLock`/`election` factories fail at once, as the Rust ones do.
#[napi]
pub fn check_key(key: String) -> napi::Result<()> {
    leasehold::Key::new(&key).map(|_| ()).map_err(js)
}

/// Throws `LEASEHOLD_INVALID_INPUT` unless `key` and `permits` make a
/// valid semaphore (`permits` 1 ..= 1024).
#[napi]
pub fn check_semaphore(key: String, permits: u32) -> napi::Result<()> {
    leasehold::Key::new(&key).map_err(js)?;
    leasehold::validate_permits(permits).map(|_| ()).map_err(js)
}
