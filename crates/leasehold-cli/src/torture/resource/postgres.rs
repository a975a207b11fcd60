//! The in-store resource on PostgreSQL: a counter table in the lock
//! database, changed only by a conditional update (`WHERE fence <= token`),
//! and a log table written in the same transaction as each decision.
//!
//! Every statement runs inside a transaction; behind a transaction-mode
//! pooler (`?pooler=transaction`) as an unnamed statement, which the
//! transaction keeps on one server connection.

use std::time::Duration;

use anyhow::Result;

use leasehold::backend::BoxFuture;
use leasehold::backends::postgres::{parse_store_url, Pooler, PostgresOptions};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use super::{Answer, FencedResource, InStore, LogRow};
use crate::exit::CliError;
use crate::torture::clock::mono_ns;
use crate::torture::history::{Decision, ResourceOp};

const SCHEMA: [&str; 2] = [
    "CREATE TABLE IF NOT EXISTS leasehold_torture_resource (
        key TEXT PRIMARY KEY, value BIGINT NOT NULL, fence BIGINT NOT NULL
    )",
    "CREATE TABLE IF NOT EXISTS leasehold_torture_log (
        seq BIGSERIAL PRIMARY KEY, t BIGINT NOT NULL, key TEXT NOT NULL,
        op TEXT NOT NULL, token BIGINT NOT NULL, value BIGINT NOT NULL,
        accepted BOOLEAN NOT NULL, highest BIGINT NOT NULL, worker BIGINT NOT NULL
    )",
];

/// The fenced read: registers the token, returns the value. Without fencing
/// the `fence <= token` condition is dropped and everything is accepted.
const READ_FENCED: &str = "UPDATE leasehold_torture_resource SET fence = GREATEST(fence, $2) \
     WHERE key = $1 AND fence <= $2 RETURNING value";
const READ_UNFENCED: &str = "UPDATE leasehold_torture_resource SET fence = GREATEST(fence, $2) \
     WHERE key = $1 RETURNING value";
const WRITE_FENCED: &str = "UPDATE leasehold_torture_resource SET value = $3, \
     fence = GREATEST(fence, $2) WHERE key = $1 AND fence <= $2 RETURNING value";
const WRITE_UNFENCED: &str = "UPDATE leasehold_torture_resource SET value = $3, \
     fence = GREATEST(fence, $2) WHERE key = $1 RETURNING value";

pub struct PostgresResource {
    pool: PgPool,
    /// Named, cached statements; false behind a transaction pooler.
    persistent: bool,
}

impl PostgresResource {
    pub async fn open(url: &str) -> Result<Self, CliError> {
        let (connect, options) = parse_store_url(url, PostgresOptions::new())
            .map_err(|e| CliError::usage(format!("resource: {e}")))?;
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(connect)
            .await
            .map_err(|e| CliError::new(crate::exit::EX_UNAVAILABLE, format!("resource: {e}")))?;
        Ok(PostgresResource {
            pool,
            persistent: options.pooler() != Pooler::Transaction,
        })
    }
}

impl InStore for PostgresResource {
    fn reset<'a>(&'a self, keys: &'a [String]) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let mut tx = self.pool.begin().await?;
            for stmt in SCHEMA {
                sqlx::query(stmt)
                    .persistent(self.persistent)
                    .execute(&mut *tx)
                    .await?;
            }
            for key in keys {
                sqlx::query(
                    "INSERT INTO leasehold_torture_resource (key, value, fence) VALUES ($1, 0, 0) \
                     ON CONFLICT (key) DO UPDATE SET value = 0, fence = 0",
                )
                .persistent(self.persistent)
                .bind(key)
                .execute(&mut *tx)
                .await?;
                sqlx::query("DELETE FROM leasehold_torture_log WHERE key = $1")
                    .persistent(self.persistent)
                    .bind(key)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            Ok(())
        })
    }

    fn decisions<'a>(&'a self, keys: &'a [String]) -> BoxFuture<'a, Result<Vec<Decision>>> {
        Box::pin(async move {
            let mut out = Vec::new();
            let mut tx = self.pool.begin().await?;
            for key in keys {
                let rows: Vec<LogRow> = sqlx::query_as(
                    "SELECT seq, t, key, op, token, value, accepted, highest, worker \
                     FROM leasehold_torture_log WHERE key = $1",
                )
                .persistent(self.persistent)
                .bind(key)
                .fetch_all(&mut *tx)
                .await?;
                out.extend(rows.into_iter().map(LogRow::into_decision));
            }
            tx.commit().await?;
            out.sort_by_key(|d| d.seq);
            Ok(out)
        })
    }

    fn connect(&self, worker: u32, fencing: bool) -> Box<dyn FencedResource> {
        Box::new(Conn {
            pool: self.pool.clone(),
            persistent: self.persistent,
            worker,
            fencing,
        })
    }
}

struct Conn {
    pool: PgPool,
    persistent: bool,
    worker: u32,
    fencing: bool,
}

impl Conn {
    /// One decision in one transaction: the conditional update decides, the
    /// log row records it. `highest` is read first only for the log; the
    /// row lock (`FOR UPDATE`) makes it the value the update saw.
    async fn decide(
        &self,
        op: ResourceOp,
        key: &str,
        token: u64,
        value: i64,
    ) -> Result<(Option<i64>, u64)> {
        let mut tx = self.pool.begin().await?;
        let highest: i64 = sqlx::query_scalar(
            "SELECT fence FROM leasehold_torture_resource WHERE key = $1 FOR UPDATE",
        )
        .persistent(self.persistent)
        .bind(key)
        .fetch_one(&mut *tx)
        .await?;
        let stmt = match (op, self.fencing) {
            (ResourceOp::Read, true) => READ_FENCED,
            (ResourceOp::Read, false) => READ_UNFENCED,
            (ResourceOp::Write, true) => WRITE_FENCED,
            (ResourceOp::Write, false) => WRITE_UNFENCED,
        };
        let result: Option<i64> = sqlx::query_scalar(stmt)
            .persistent(self.persistent)
            .bind(key)
            .bind(token as i64)
            .bind(value)
            .fetch_optional(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO leasehold_torture_log (t, key, op, token, value, accepted, highest, worker) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .persistent(self.persistent)
        .bind(mono_ns() as i64)
        .bind(key)
        .bind(match op {
            ResourceOp::Read => "read",
            ResourceOp::Write => "write",
        })
        .bind(token as i64)
        .bind(result.unwrap_or(value))
        .bind(result.is_some())
        .bind(highest)
        .bind(i64::from(self.worker))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok((result, highest as u64))
    }
}

impl FencedResource for Conn {
    fn read<'a>(&'a mut self, key: &'a str, token: u64) -> BoxFuture<'a, Result<Answer<i64>>> {
        Box::pin(async move {
            Ok(match self.decide(ResourceOp::Read, key, token, 0).await? {
                (Some(v), _) => Answer::Accepted(v),
                (None, highest) => Answer::Fenced { highest },
            })
        })
    }

    fn write<'a>(
        &'a mut self,
        key: &'a str,
        token: u64,
        value: i64,
    ) -> BoxFuture<'a, Result<Answer<()>>> {
        Box::pin(async move {
            Ok(
                match self.decide(ResourceOp::Write, key, token, value).await? {
                    (Some(_), _) => Answer::Accepted(()),
                    (None, highest) => Answer::Fenced { highest },
                },
            )
        })
    }
}
