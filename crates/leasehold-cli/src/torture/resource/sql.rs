//! The in-store resource on an SQL store (SQLite, PostgreSQL): a counter
//! table in the lock database, changed only by a conditional update
//! (`WHERE fence <= token`), and a log table written in the same
//! transaction as each decision.

use std::time::Duration;

use anyhow::Result;
use futures_util::future::BoxFuture;

use super::{FencedResource, InStore, LogRow, Operation, Reply};
use crate::exit::CliError;
use crate::sql::{Arg, BusyTimeout, SqlDb};
use crate::torture::clock::mono_ns;
use crate::torture::history::{Decision, ResourceOp};

/// The fenced read registers the token and returns the value; the write
/// also sets the value. Without fencing the `fence <= token` condition is
/// dropped and everything is accepted.
const READ: &str = "UPDATE leasehold_torture_resource \
     SET fence = CASE WHEN fence > $2 THEN fence ELSE $2 END WHERE key = $1";
const WRITE: &str = "UPDATE leasehold_torture_resource SET value = $3, \
     fence = CASE WHEN fence > $2 THEN fence ELSE $2 END WHERE key = $1";
const IF_FENCE_ALLOWS: &str = " AND fence <= $2";
const RETURNING: &str = " RETURNING value";

/// Every decision is logged in the same transaction that makes it.
const LOG: &str = "INSERT INTO leasehold_torture_log \
     (t, key, op, token, value, accepted, highest, worker) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";

pub struct SqlResource {
    db: SqlDb,
}

impl SqlResource {
    /// `None` for a store that is not SQL.
    pub async fn open(url: &str) -> Result<Option<Self>, CliError> {
        // The library's own default: a worker paused by the nemesis may
        // hold the write lock; the others fail and retry after this.
        let busy = BusyTimeout(Duration::from_secs(5));
        Ok(SqlDb::open(url, "resource", busy)
            .await?
            .map(|db| SqlResource { db }))
    }
}

impl InStore for SqlResource {
    fn reset<'a>(&'a self, keys: &'a [String]) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let d = self.db.dialect;
            self.db
                .create_tables(&[
                    format!(
                        "CREATE TABLE IF NOT EXISTS leasehold_torture_resource (
                            key TEXT PRIMARY KEY NOT NULL, value BIGINT NOT NULL, fence BIGINT NOT NULL
                        ){}",
                        d.table_options
                    ),
                    format!(
                        "CREATE TABLE IF NOT EXISTS leasehold_torture_log (
                            seq {}, t BIGINT NOT NULL, key TEXT NOT NULL,
                            op TEXT NOT NULL, token BIGINT NOT NULL, value BIGINT NOT NULL,
                            accepted BOOLEAN NOT NULL, highest BIGINT NOT NULL, worker BIGINT NOT NULL
                        )",
                        d.serial_key
                    ),
                ])
                .await?;
            let mut tx = self.db.begin().await?;
            for key in keys {
                tx.execute(
                    "INSERT INTO leasehold_torture_resource (key, value, fence) VALUES ($1, 0, 0) \
                     ON CONFLICT (key) DO UPDATE SET value = 0, fence = 0",
                    &[Arg::Text(key)],
                )
                .await?;
                tx.execute(
                    "DELETE FROM leasehold_torture_log WHERE key = $1",
                    &[Arg::Text(key)],
                )
                .await?;
            }
            Ok(tx.commit().await?)
        })
    }

    fn decisions<'a>(&'a self, keys: &'a [String]) -> BoxFuture<'a, Result<Vec<Decision>>> {
        Box::pin(async move {
            let mut out = Vec::new();
            for key in keys {
                let rows: Vec<LogRow> = self
                    .db
                    .fetch_all(
                        "SELECT seq, t, key, op, token, value, accepted, highest, worker \
                         FROM leasehold_torture_log WHERE key = $1",
                        &[Arg::Text(key)],
                    )
                    .await?;
                out.extend(rows.into_iter().map(LogRow::into_decision));
            }
            out.sort_by_key(|d| d.seq);
            Ok(out)
        })
    }

    fn connect(&self, worker: u32, fencing: bool) -> Box<dyn FencedResource> {
        Box::new(Conn {
            db: self.db.clone(),
            worker,
            fencing,
        })
    }
}

struct Conn {
    db: SqlDb,
    worker: u32,
    fencing: bool,
}

impl FencedResource for Conn {
    /// One decision in one write transaction: the conditional update
    /// decides, the log row records it. `highest` is read first only for
    /// the log; the write lock (SQLite) or row lock (PostgreSQL) makes it
    /// the value the update saw.
    fn decide<'a>(&'a mut self, operation: Operation<'a>) -> BoxFuture<'a, Result<Reply>> {
        Box::pin(async move {
            let Operation {
                op,
                key,
                token,
                value,
            } = operation;
            if op == ResourceOp::SharedRead {
                // The plan refuses --primitive rw with --resource store.
                anyhow::bail!("the in-store resource has no shared reads");
            }
            let token = i64::try_from(token)?;
            let mut tx = self.db.begin_write().await?;
            let highest = tx
                .select_for_update(
                    "SELECT fence FROM leasehold_torture_resource WHERE key = $1",
                    key,
                )
                .await?;
            let update = match op {
                ResourceOp::Read => READ,
                ResourceOp::Write | ResourceOp::SharedRead => WRITE,
            };
            let condition = if self.fencing { IF_FENCE_ALLOWS } else { "" };
            let result: Option<(i64,)> = tx
                .fetch_optional(
                    &format!("{update}{condition}{RETURNING}"),
                    &[Arg::Text(key), Arg::Int(token), Arg::Int(value)],
                )
                .await?;
            let reply = Reply {
                accepted: result.is_some(),
                value: result.map_or(value, |(v,)| v),
                highest: u64::try_from(highest)?,
            };
            tx.execute(
                LOG,
                &[
                    Arg::Int(i64::try_from(mono_ns())?),
                    Arg::Text(key),
                    Arg::Text(op.name()),
                    Arg::Int(token),
                    Arg::Int(reply.value),
                    Arg::Bool(reply.accepted),
                    Arg::Int(highest),
                    Arg::Int(i64::from(self.worker)),
                ],
            )
            .await?;
            tx.commit().await?;
            Ok(reply)
        })
    }
}
