//! Classifying driver errors: what retrying may fix.

use crate::error::Error;

/// The name errors carry ([`Error::store`]).
pub(super) const STORE: &str = "etcd";

mod codes {
    pub(super) use etcd_client::Error as Driver;
    // gRPC status codes that say "try again" (tonic's `Code`, by number,
    // so no direct dependency on tonic is needed).
    pub(super) const CANCELLED: i32 = 1;
    pub(super) const DEADLINE_EXCEEDED: i32 = 4;
    pub(super) const RESOURCE_EXHAUSTED: i32 = 8;
    pub(super) const ABORTED: i32 = 10;
    pub(super) const UNAVAILABLE: i32 = 14;
}

/// Messages of etcd's own transient conditions, which it sends with code
/// Unknown: a leader change or election in progress, a proposal dropped.
const TRANSIENT_MESSAGES: &[&str] = &[
    "leader changed",
    "no leader",
    "timed out",
    "request timed out",
    "too many requests",
    "not capable",
    "proposal dropped",
    "stopped",
    // tonic's own statuses for a connection lost mid-request (code Unknown).
    "transport error",
    "connection",
];

/// Whether the request failed at the transport, before or while reaching
/// a member (connection refused or reset): another member may answer.
pub(super) fn at_transport(e: &codes::Driver) -> bool {
    match e {
        codes::Driver::TransportError(_) | codes::Driver::IoError(_) => true,
        codes::Driver::GRpcStatus(status) => {
            let message = status.message();
            message.contains("tcp connect error")
                || message.contains("transport error")
                || message.contains("error trying to connect")
        }
        _ => false,
    }
}

/// Network trouble, timeouts and leader changes are transient; everything
/// else is a store error.
pub(super) fn classify(e: codes::Driver) -> Error {
    use codes::*;
    let transient = match &e {
        Driver::TransportError(_) | Driver::IoError(_) | Driver::WatchError(_) => true,
        Driver::GRpcStatus(status) => {
            let code = status.code() as i32;
            [
                CANCELLED,
                DEADLINE_EXCEEDED,
                RESOURCE_EXHAUSTED,
                ABORTED,
                UNAVAILABLE,
            ]
            .contains(&code)
                || TRANSIENT_MESSAGES
                    .iter()
                    .any(|m| status.message().contains(m))
        }
        _ => false,
    };
    Error::from_store(STORE, transient, e)
}

/// A request that got no answer within its bound.
pub(super) fn timed_out(what: &'static str) -> Error {
    Error::unavailable(format!("etcd did not answer {what} in time")).in_store(STORE)
}
