//! Connection poolers between the store and PostgreSQL: the [`Pooler`]
//! setting, and errors that only a pooler causes, told as such.
//!
//! A pooler in *transaction* mode (PgBouncer `pool_mode = transaction`,
//! and managed poolers built like it) hands each transaction to whichever
//! server connection is free, so nothing may outlive a transaction: no
//! named prepared statement, no `LISTEN`, no session setting. sqlx prepares
//! every query under a name (`sqlx_s_1`, ...), even with its statement
//! cache off; and its unnamed statements are parsed and bound in two
//! separate protocol round trips, between which the pooler may switch
//! server connections (the bind then runs another client's statement).
//! So in [`Pooler::Transaction`] mode the store sends each statement as
//! one simple-protocol message (see `exec`), never listens on a pooled
//! connection, and leaves out the `extra_float_digits` startup parameter
//! PgBouncer rejects unless told to ignore it.

use std::fmt;

/// What sits between the store and PostgreSQL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Pooler {
    /// The server itself, or a pooler in session mode: a client keeps its
    /// server connection, so prepared statements are cached and `LISTEN`
    /// runs on a pool connection. The default.
    #[default]
    None,
    /// A pooler in transaction mode (PgBouncer `pool_mode = transaction`):
    /// statements go unprepared, one message each, and `LISTEN` needs a
    /// listen URL past the pooler (otherwise waiters poll). URL option
    /// `?pooler=transaction`.
    Transaction,
}

impl Pooler {
    /// Reads the `pooler` URL option: `none` or `transaction`.
    pub(super) fn from_url_value(value: &str) -> Option<Pooler> {
        match value {
            "none" | "session" => Some(Pooler::None),
            "transaction" => Some(Pooler::Transaction),
            _ => None,
        }
    }
}

/// A database error a connection pooler caused, with what to change.
#[derive(Debug)]
pub(super) struct PoolerError {
    source: sqlx::Error,
    advice: String,
}

impl fmt::Display for PoolerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.source, self.advice)
    }
}

impl std::error::Error for PoolerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// `e` with advice attached if only a connection pooler causes it; `Err(e)`
/// unchanged otherwise.
pub(super) fn explain(e: sqlx::Error) -> Result<PoolerError, sqlx::Error> {
    match advice(&e) {
        Some(advice) => Ok(PoolerError { source: e, advice }),
        None => Err(e),
    }
}

fn advice(e: &sqlx::Error) -> Option<String> {
    if let sqlx::Error::Protocol(message) = e {
        // A NOTIFY delivered to a data connection: its server connection
        // was left listening by some client that ran LISTEN through a
        // transaction-mode pooler.
        return message.contains("NotificationResponse").then(|| {
            "a notification reached a data connection: some client runs LISTEN through a \
             transaction-mode pooler; give LISTEN a direct connection with \
             ?listen_url=postgres://... and add ?pooler=transaction to the store url"
                .to_owned()
        });
    }
    let db = e.as_database_error()?;
    let code = db.code()?;
    let message = db.message();
    if code == "08P01" {
        // PgBouncer: "unsupported startup parameter: NAME".
        let parameter = message.strip_prefix("unsupported startup parameter: ")?;
        return Some(format!(
            "a connection pooler such as PgBouncer rejects the startup parameter {parameter:?}: \
             set ignore_startup_parameters = extra_float_digits,options in its config, \
             or add ?pooler=transaction to the store url so that extra_float_digits is not sent"
        ));
    }
    // 42P05 duplicate_prepared_statement, 26000 invalid_sql_statement_name:
    // the pooler moved a client's named statements to another connection.
    if matches!(&*code, "42P05" | "26000") && message.contains("prepared statement") {
        return Some(
            "a transaction-mode connection pooler gave this client another server \
             connection: add ?pooler=transaction to the store url, or set \
             max_prepared_statements in PgBouncer 1.21 or later"
                .to_owned(),
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_values() {
        assert_eq!(
            Pooler::from_url_value("transaction"),
            Some(Pooler::Transaction)
        );
        assert_eq!(Pooler::from_url_value("none"), Some(Pooler::None));
        assert_eq!(Pooler::from_url_value("session"), Some(Pooler::None));
        assert_eq!(Pooler::from_url_value("Transaction"), None);
    }

    #[test]
    fn notification_on_a_data_connection_is_explained() {
        let e =
            sqlx::Error::Protocol("execute: unexpected message: NotificationResponse".to_owned());
        let explained = explain(e).expect("a pooler error").to_string();
        assert!(explained.contains("listen_url"), "{explained}");
        assert!(explain(sqlx::Error::Protocol("other".to_owned())).is_err());
    }
}
