//! The protected resource: a counter per key that accepts an operation only
//! if its fencing token is at least the highest it has accepted for that key.
//!
//! A read counts as accepted too: it registers the reader's token, so a
//! stale holder that read *before* a newer holder cannot write *after* that
//! holder read. Fencing only writes would let such a write through and lose
//! the newer holder's increment.
//!
//! Two variants, one interface for the workers ([`FencedResource`]):
//! - `server`: a small TCP server on loopback inside the harness
//!   ([`server`]), which logs every decision; works with every store.
//! - `store`: the counter in the lock store itself, behind a conditional
//!   update (`WHERE fence <= token`), with its decisions logged in the same
//!   transaction. One file per store that offers it ([`sqlite`],
//!   [`postgres`]).
//!   Adding a store: implement [`InStore`] in a new file (MongoDB: `findOneAndUpdate` with
//!   `{fence: {$lte: token}}`; Redis: a Lua compare-and-set on a hash) and
//!   add its scheme to [`in_store`].

pub mod server;
#[cfg(test)]
mod tests;

mod postgres;
mod sqlite;

use anyhow::Result;
use leasehold::backend::BoxFuture;

use super::history::{Decision, ResourceOp};
use crate::exit::CliError;

/// What the resource answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer<T> {
    Accepted(T),
    /// Refused: the resource has accepted a newer token for the key.
    Fenced {
        highest: u64,
    },
}

/// The resource as a worker sees it.
pub trait FencedResource: Send {
    /// Returns the counter and registers `token` as seen.
    fn read<'a>(&'a mut self, key: &'a str, token: u64) -> BoxFuture<'a, Result<Answer<i64>>>;
    /// Sets the counter to `value`.
    fn write<'a>(
        &'a mut self,
        key: &'a str,
        token: u64,
        value: i64,
    ) -> BoxFuture<'a, Result<Answer<()>>>;
}

/// The harness's side of an in-store resource: set up, then read the log.
pub trait InStore: Send + Sync {
    /// Creates the tables if needed and sets `keys` to value 0, fence 0.
    fn reset<'a>(&'a self, keys: &'a [String]) -> BoxFuture<'a, Result<()>>;
    /// Every decision about `keys`, in the order they were made.
    fn decisions<'a>(&'a self, keys: &'a [String]) -> BoxFuture<'a, Result<Vec<Decision>>>;
    /// A connection for worker `worker`.
    fn connect(&self, worker: u32, fencing: bool) -> Box<dyn FencedResource>;
}

/// The in-store resource of the store at `url`, if that store offers one.
///
/// # Errors
/// Usage error (64) for a store without one; the store's error if it
/// cannot be opened.
pub async fn in_store(url: &str) -> Result<Box<dyn InStore>, CliError> {
    let scheme = url.split_once("://").map_or("", |(s, _)| s);
    match scheme {
        "sqlite" => Ok(Box::new(sqlite::SqliteResource::open(url).await?)),
        "postgres" | "postgresql" => Ok(Box::new(postgres::PostgresResource::open(url).await?)),
        _ => Err(CliError::usage(format!(
            "--resource store is not available for {scheme}:// yet (SQLite and PostgreSQL); \
             use --resource server"
        ))),
    }
}

/// How a worker reaches the resource, as passed on its command line:
/// `tcp://ADDR` for the harness's server, `store` for the in-store variant.
pub async fn connect(
    spec: &str,
    store_url: &str,
    worker: u32,
    fencing: bool,
) -> Result<Box<dyn FencedResource>, CliError> {
    if let Some(addr) = spec.strip_prefix("tcp://") {
        let client = server::Client::connect(addr, worker).await.map_err(|e| {
            CliError::new(
                crate::exit::EX_UNAVAILABLE,
                format!("resource at {addr}: {e}"),
            )
        })?;
        return Ok(Box::new(client));
    }
    if spec == "store" {
        return Ok(in_store(store_url).await?.connect(worker, fencing));
    }
    Err(CliError::usage(format!(
        "resource {spec:?}: expected tcp://ADDR or store"
    )))
}

/// A row of an in-store decision log (the same columns on every SQL store).
#[derive(sqlx::FromRow)]
pub(super) struct LogRow {
    seq: i64,
    t: i64,
    key: String,
    op: String,
    token: i64,
    value: i64,
    accepted: bool,
    highest: i64,
    worker: i64,
}

impl LogRow {
    pub(super) fn into_decision(self) -> Decision {
        Decision {
            seq: self.seq as u64,
            t: self.t as u64,
            key: self.key,
            op: if self.op == "read" {
                ResourceOp::Read
            } else {
                ResourceOp::Write
            },
            token: self.token as u64,
            value: self.value,
            accepted: self.accepted,
            highest: self.highest as u64,
            worker: self.worker as u32,
        }
    }
}
