//! Classifying driver errors: what retrying may fix, and what busy looks like.

use mongodb::error::ErrorKind;

use crate::error::Error;

/// The name errors carry ([`Error::store`]).
pub(super) const STORE: &str = "mongodb";

/// The server's error code of a command or write error, if any.
pub(crate) fn server_code(e: &mongodb::error::Error) -> Option<i32> {
    match e.kind.as_ref() {
        ErrorKind::Command(c) => Some(c.code),
        ErrorKind::Write(mongodb::error::WriteFailure::WriteError(w)) => Some(w.code),
        ErrorKind::Write(mongodb::error::WriteFailure::WriteConcernError(w)) => Some(w.code),
        _ => None,
    }
}

pub(super) fn is_duplicate_key(e: &mongodb::error::Error) -> bool {
    server_code(e) == Some(11000)
}

/// Network trouble, timeouts, no reachable primary, and anything the driver
/// labels retryable are transient; everything else is a store error.
pub(crate) fn classify(e: mongodb::error::Error) -> Error {
    use mongodb::error::{RETRYABLE_WRITE_ERROR, TRANSIENT_TRANSACTION_ERROR};
    // NotWritablePrimary, NotPrimaryNoSecondaryOk, NotPrimaryOrSecondary,
    // the shutdown/recovering codes, and ExceededTimeLimit/NetworkTimeout.
    const TRANSIENT_CODES: &[i32] = &[
        10107, 13435, 13436, 11600, 11602, 189, 91, 6, 7, 89, 9001, 50, 262, 112,
    ];
    let transient = matches!(
        e.kind.as_ref(),
        ErrorKind::Io(_)
            | ErrorKind::ServerSelection { .. }
            | ErrorKind::ConnectionPoolCleared { .. }
    ) || e.contains_label(RETRYABLE_WRITE_ERROR)
        || e.contains_label(TRANSIENT_TRANSACTION_ERROR)
        || server_code(&e).is_some_and(|c| TRANSIENT_CODES.contains(&c));
    Error::from_store(STORE, transient, e)
}
