//! How one statement of the store goes to the server.
//!
//! Directly (and through a session-mode pooler) it is prepared once per
//! connection and cached by sqlx: one round trip per operation.
//!
//! Behind a transaction-mode pooler nothing may outlive the statement, and
//! sqlx has no way to send an unnamed statement as one message: it parses
//! and binds in two round trips, each ended by `Sync`, and the pooler may
//! hand the second to another server connection, where it binds whatever
//! statement *that* client parsed last. So the parameters are written into
//! the SQL as typed literals (`E'...'::text`, `(42)::int8`) and the whole
//! statement is sent as one simple-protocol `Query` message: one round trip,
//! no statement names, nothing left on the server connection. The literals
//! are built here only, from text without NUL and from integers; `E'...'`
//! escapes `\` and `'` and means the same whatever the server's
//! `standard_conforming_strings`.

use std::borrow::Cow;
use std::fmt::Write as _;

use sqlx::postgres::{PgArguments, PgConnection, PgQueryResult, PgRow};
use sqlx::{Arguments, Executor};

use super::pooler::Pooler;
use crate::backend::BoxFuture;

/// A statement parameter, bound as `text` or `int8`.
#[derive(Debug, Clone, Copy)]
pub(super) enum Param<'a> {
    Text(&'a str),
    Int(i64),
}

// The functions return boxed futures with one lifetime: as plain `async fn`s
// over sqlx's executors, the callers' futures are not provably `Send`.

/// Runs `sql` (placeholders `$1`..`$N`) with `params` and returns its rows.
pub(super) fn fetch_all<'a>(
    conn: &'a mut PgConnection,
    pooler: Pooler,
    sql: &'a str,
    params: &'a [Param<'a>],
) -> BoxFuture<'a, Result<Vec<PgRow>, sqlx::Error>> {
    Box::pin(async move {
        let (sql, arguments) = prepare(pooler, sql, params)?;
        conn.fetch_all((sql.as_ref(), arguments)).await
    })
}

/// Runs `sql` and returns what it changed.
pub(super) fn execute<'a>(
    conn: &'a mut PgConnection,
    pooler: Pooler,
    sql: &'a str,
    params: &'a [Param<'a>],
) -> BoxFuture<'a, Result<PgQueryResult, sqlx::Error>> {
    Box::pin(async move {
        let (sql, arguments) = prepare(pooler, sql, params)?;
        conn.execute((sql.as_ref(), arguments)).await
    })
}

/// `sql` with `params` in the form `pooler` lets through (see the module
/// comment): the text as written with the parameters bound, for a statement
/// sqlx prepares and caches; or, behind a transaction-mode pooler, one text
/// with the parameters inlined and no arguments, which sqlx sends as a
/// simple-protocol `Query`.
fn prepare<'a>(
    pooler: Pooler,
    sql: &'a str,
    params: &[Param<'_>],
) -> Result<(Cow<'a, str>, Option<PgArguments>), sqlx::Error> {
    match pooler {
        Pooler::Transaction => Ok((Cow::Owned(inline(sql, params)?), None)),
        _ => Ok((Cow::Borrowed(sql), Some(bind(params)?))),
    }
}

fn bind(params: &[Param<'_>]) -> Result<PgArguments, sqlx::Error> {
    let mut arguments = PgArguments::default();
    for param in params {
        match *param {
            Param::Text(text) => arguments.add(text),
            Param::Int(n) => arguments.add(n),
        }
        .map_err(sqlx::Error::Encode)?;
    }
    Ok(arguments)
}

/// `sql` with each `$N` replaced by parameter N as a typed literal. The
/// statement texts are the store's own (no `$` inside their string
/// literals); the values are never scanned for placeholders.
fn inline(sql: &str, params: &[Param<'_>]) -> Result<String, sqlx::Error> {
    let mut out = String::with_capacity(sql.len() + 64);
    let mut rest = sql;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let digits = rest[at + 1..]
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len() - at - 1);
        let n: usize = rest[at + 1..at + 1 + digits]
            .parse()
            .map_err(|_| protocol("a '$' without a parameter number"))?;
        let param = n
            .checked_sub(1)
            .and_then(|i| params.get(i))
            .ok_or_else(|| protocol("a placeholder without a parameter"))?;
        match *param {
            Param::Text(text) => text_literal(&mut out, text)?,
            // Parenthesized: a negative number next to an operator.
            Param::Int(value) => write!(out, "({value})::int8").expect("writing to a String"),
        }
        rest = &rest[at + 1 + digits..];
    }
    out.push_str(rest);
    Ok(out)
}

fn text_literal(out: &mut String, text: &str) -> Result<(), sqlx::Error> {
    if text.contains('\0') {
        // PostgreSQL text cannot hold NUL, and it would end the message.
        return Err(sqlx::Error::Encode("text parameter contains NUL".into()));
    }
    out.push_str("E'");
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("''"),
            c => out.push(c),
        }
    }
    out.push_str("'::text");
    Ok(())
}

fn protocol(what: &str) -> sqlx::Error {
    sqlx::Error::Protocol(format!("leasehold statement with {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_become_typed_literals() {
        let sql = inline(
            "SELECT $1 WHERE a = $2 AND b = $10 OR c = $1",
            &[
                Param::Text("it's a \\ $2 key"),
                Param::Int(-5),
                Param::Int(0),
                Param::Int(0),
                Param::Int(0),
                Param::Int(0),
                Param::Int(0),
                Param::Int(0),
                Param::Int(0),
                Param::Int(i64::MIN),
            ],
        )
        .unwrap();
        assert_eq!(
            sql,
            "SELECT E'it''s a \\\\ $2 key'::text WHERE a = (-5)::int8 \
             AND b = (-9223372036854775808)::int8 OR c = E'it''s a \\\\ $2 key'::text"
        );
    }

    #[test]
    fn bad_statements_and_values_fail_before_sending() {
        assert!(inline("SELECT $2", &[Param::Int(1)]).is_err());
        assert!(inline("SELECT $0", &[Param::Int(1)]).is_err());
        assert!(inline("SELECT $x", &[]).is_err());
        assert!(inline("SELECT $1", &[Param::Text("a\0b")]).is_err());
    }
}
