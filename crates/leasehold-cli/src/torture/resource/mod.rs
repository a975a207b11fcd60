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
//!   transaction: [`sql`], one implementation for SQLite and PostgreSQL.
//!   Adding a store: implement [`InStore`] in a new file (MongoDB: `findOneAndUpdate` with
//!   `{fence: {$lte: token}}`; Redis: a Lua compare-and-set on a hash) and
//!   try it in [`in_store`].

pub mod server;
mod sql;
#[cfg(test)]
mod tests;

use anyhow::Result;
use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};

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

/// One decision of the resource, as it answers it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Reply {
    pub accepted: bool,
    /// Read: the counter. Write: the value written (or refused).
    pub value: i64,
    /// The highest token accepted for the key before this decision.
    pub highest: u64,
}

impl Reply {
    fn answer<T>(&self, accepted: T) -> Answer<T> {
        if self.accepted {
            Answer::Accepted(accepted)
        } else {
            Answer::Fenced {
                highest: self.highest,
            }
        }
    }
}

/// One operation a worker asks the resource to decide.
#[derive(Debug, Clone, Copy)]
pub struct Operation<'a> {
    pub op: ResourceOp,
    pub key: &'a str,
    pub token: u64,
    /// Write: the value to set; read: 0.
    pub value: i64,
}

/// The resource as a worker sees it.
pub trait FencedResource: Send {
    /// Decides `operation`: a read registers the token and returns the
    /// counter; a write also sets the counter to its value.
    fn decide<'a>(&'a mut self, operation: Operation<'a>) -> BoxFuture<'a, Result<Reply>>;
}

impl dyn FencedResource + '_ {
    /// Returns the counter and registers `token` as seen.
    pub async fn read(&mut self, key: &str, token: u64) -> Result<Answer<i64>> {
        self.read_as(ResourceOp::Read, key, token).await
    }

    /// A read-write lock reader's read: returns the counter, compared with
    /// writers' tokens only.
    pub async fn shared_read(&mut self, key: &str, token: u64) -> Result<Answer<i64>> {
        self.read_as(ResourceOp::SharedRead, key, token).await
    }

    async fn read_as(&mut self, op: ResourceOp, key: &str, token: u64) -> Result<Answer<i64>> {
        let reply = self
            .decide(Operation {
                op,
                key,
                token,
                value: 0,
            })
            .await?;
        Ok(reply.answer(reply.value))
    }

    /// Sets the counter to `value`.
    pub async fn write(&mut self, key: &str, token: u64, value: i64) -> Result<Answer<()>> {
        let reply = self
            .decide(Operation {
                op: ResourceOp::Write,
                key,
                token,
                value,
            })
            .await?;
        Ok(reply.answer(()))
    }
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
    match sql::SqlResource::open(url).await? {
        Some(resource) => Ok(Box::new(resource)),
        None => Err(CliError::usage(format!(
            "--resource store is not available for {}:// yet (SQLite and PostgreSQL); \
             use --resource server",
            leasehold::scheme::Scheme::parse(url)?.0
        ))),
    }
}

/// The resource a run set up, whichever variant.
pub enum Resource {
    Server(server::Server),
    InStore(Box<dyn InStore>),
}

impl Resource {
    /// Starts the server, or resets `keys` in the store's own tables.
    pub async fn set_up(
        kind: super::ResourceKind,
        store: &str,
        keys: &[String],
        fencing: bool,
    ) -> Result<Resource, CliError> {
        Ok(match kind {
            super::ResourceKind::Server => Resource::Server(
                server::Server::start(fencing)
                    .await
                    .map_err(|e| CliError::new(crate::exit::EX_SOFTWARE, e.to_string()))?,
            ),
            super::ResourceKind::Store => {
                let resource = in_store(store).await?;
                resource.reset(keys).await.map_err(store_error)?;
                Resource::InStore(resource)
            }
        })
    }

    /// How workers reach it (see [`connect`]).
    pub fn spec(&self) -> String {
        match self {
            Resource::Server(server) => format!("tcp://{}", server.addr()),
            Resource::InStore(_) => "store".to_owned(),
        }
    }

    /// As the report names it.
    pub fn name(&self) -> &'static str {
        match self {
            Resource::Server(_) => "server",
            Resource::InStore(_) => "store",
        }
    }

    /// Every decision about `keys`, in the order made.
    pub async fn decisions(&self, keys: &[String]) -> Result<Vec<Decision>, CliError> {
        match self {
            Resource::Server(server) => Ok(server.decisions()),
            Resource::InStore(resource) => resource.decisions(keys).await.map_err(store_error),
        }
    }
}

fn store_error(e: anyhow::Error) -> CliError {
    CliError::new(
        crate::exit::EX_UNAVAILABLE,
        format!("torture resource in the store: {e:#}"),
    )
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
            op: if self.op == ResourceOp::Read.name() {
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
