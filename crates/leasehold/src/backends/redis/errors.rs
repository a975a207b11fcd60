//! How driver errors map onto [`Error`]: what a caller may retry, and what
//! it must fix.

use redis::RedisError;

use super::STORE;
use crate::error::Error;

/// Transient failures (I/O, timeouts, a server loading or busy, cluster
/// redirects and failovers) are retryable; everything else is permanent.
pub(super) fn classify(e: RedisError) -> Error {
    use redis::{ErrorKind as K, ServerErrorKind as S};
    let transient = e.is_io_error()
        || e.is_timeout()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_cluster_error()
        || matches!(
            e.kind(),
            K::Server(S::BusyLoading | S::TryAgain | S::MasterDown | S::ReadOnly)
        )
        || e.code() == Some("BUSY")
        || cut_short_by_failover(&e);
    if transient {
        Error::unavailable(e)
    } else {
        Error::backend(e)
    }
    .in_store(STORE)
}

/// A `WAIT` a primary ended with `UNBLOCKED` because it was turning into a
/// replica (a failover): whether the write survives is unknown, as after a
/// timeout. In a pipeline the error sits at the `WAIT`'s index, where
/// [`RedisError::code`] does not look.
fn cut_short_by_failover(e: &RedisError) -> bool {
    e.clone()
        .into_server_errors()
        .is_some_and(|errors| errors.iter().any(|(_, e)| e.code() == "UNBLOCKED"))
}

/// A call that fewer than `min_replicas` replicas confirmed: retryable (a
/// replica may be catching up or failing over).
pub(super) fn unconfirmed(confirmed: i64, wanted: u32) -> Error {
    Error::unavailable(format!(
        "the write was confirmed by {confirmed} of the {wanted} replicas min_replicas asks for"
    ))
    .in_store(STORE)
}
