//! The demo's product row in the PostgreSQL database that holds the locks.
//!
//! The row-lock strategy is the library's own
//! [`with_locked_rows`](leasehold::rowlock::with_locked_rows): the demo shows
//! the helper an application would use, not a hand-written transaction.
//!
//! Behind a transaction-mode pooler (`?pooler=transaction` in the URL) every
//! statement runs as an unnamed statement inside a transaction, which keeps
//! its server connection until it ends: what docs/postgres.md tells an
//! application to do with its own queries there.

use std::time::Duration;

use leasehold::backend::BoxFuture;
use leasehold::backends::postgres::{parse_store_url, Pooler, PostgresOptions};
use leasehold::rowlock::{with_locked_rows, LockMode, RowLockOptions};
use sqlx::postgres::{PgArguments, PgPool, PgPoolOptions, PgQueryResult, PgRow};
use sqlx::query::Query;
use sqlx::{Postgres, Row};

use super::{store_error, Inventory, Stock};
use crate::exit::CliError;

const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS leasehold_demo_products (
    id TEXT PRIMARY KEY,
    stock BIGINT NOT NULL,
    version BIGINT NOT NULL,
    fence BIGINT NOT NULL
)";

pub struct PostgresInventory {
    pool: PgPool,
    pooler: Pooler,
}

impl PostgresInventory {
    pub async fn open(url: &str) -> Result<Self, CliError> {
        let (options, store_options) = parse_store_url(url, PostgresOptions::new())
            .map_err(|e| CliError::usage(e.to_string()))?;
        let pooler = store_options.pooler();
        let persistent = pooler != Pooler::Transaction;
        let pool = PgPoolOptions::new()
            // One worker runs one order at a time; the orchestrator only
            // resets and reads.
            .max_connections(2)
            // Fail like the lock store does when the server is down.
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(options)
            .await
            .map_err(store_error)?;
        // Worker processes start together; CREATE TABLE IF NOT EXISTS is not
        // safe against a concurrent twin (duplicate pg_type row), so take a
        // transaction-scoped advisory lock first.
        let mut tx = pool.begin().await.map_err(store_error)?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('leasehold_demo_products'))")
            .persistent(persistent)
            .execute(&mut *tx)
            .await
            .map_err(store_error)?;
        sqlx::query(CREATE_TABLE)
            .persistent(persistent)
            .execute(&mut *tx)
            .await
            .map_err(store_error)?;
        tx.commit().await.map_err(store_error)?;
        Ok(PostgresInventory { pool, pooler })
    }

    /// Runs one statement: prepared and cached on a direct connection;
    /// behind a transaction pooler unnamed, in a transaction of its own
    /// (sqlx parses and binds in two round trips, which only a transaction
    /// keeps on one server connection).
    async fn execute(
        &self,
        query: Query<'_, Postgres, PgArguments>,
    ) -> sqlx::Result<PgQueryResult> {
        if self.pooler != Pooler::Transaction {
            return query.execute(&self.pool).await;
        }
        let mut tx = self.pool.begin().await?;
        let done = query.persistent(false).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(done)
    }

    /// [`execute`](Self::execute) for a statement that returns one row.
    async fn fetch_one(&self, query: Query<'_, Postgres, PgArguments>) -> sqlx::Result<PgRow> {
        if self.pooler != Pooler::Transaction {
            return query.fetch_one(&self.pool).await;
        }
        let mut tx = self.pool.begin().await?;
        let row = query.persistent(false).fetch_one(&mut *tx).await?;
        tx.commit().await?;
        Ok(row)
    }

    async fn changed(&self, query: Query<'_, Postgres, PgArguments>) -> Result<bool, CliError> {
        let done = self.execute(query).await.map_err(store_error)?;
        Ok(done.rows_affected() == 1)
    }
}

impl Inventory for PostgresInventory {
    fn reset<'a>(&'a self, product: &'a str, stock: i64) -> BoxFuture<'a, Result<(), CliError>> {
        Box::pin(async move {
            self.execute(
                sqlx::query(
                    "INSERT INTO leasehold_demo_products (id, stock, version, fence) VALUES ($1, $2, 0, 0)
                 ON CONFLICT (id) DO UPDATE SET stock = $2, version = 0, fence = 0",
                )
                .bind(product)
                .bind(stock),
            )
            .await
            .map_err(store_error)?;
            Ok(())
        })
    }

    fn read<'a>(&'a self, product: &'a str) -> BoxFuture<'a, Result<Stock, CliError>> {
        Box::pin(async move {
            let row = self
                .fetch_one(
                    sqlx::query("SELECT stock, version FROM leasehold_demo_products WHERE id = $1")
                        .bind(product),
                )
                .await
                .map_err(store_error)?;
            Ok(Stock {
                stock: row.get(0),
                version: row.get(1),
            })
        })
    }

    fn write_unchecked<'a>(
        &'a self,
        product: &'a str,
        stock: i64,
    ) -> BoxFuture<'a, Result<(), CliError>> {
        Box::pin(async move {
            self.changed(
                sqlx::query("UPDATE leasehold_demo_products SET stock = $2 WHERE id = $1")
                    .bind(product)
                    .bind(stock),
            )
            .await
            .map(drop)
        })
    }

    fn write_fenced<'a>(
        &'a self,
        product: &'a str,
        stock: i64,
        token: u64,
    ) -> BoxFuture<'a, Result<bool, CliError>> {
        Box::pin(async move {
            let token = i64::try_from(token)
                .map_err(|_| CliError::usage(format!("fencing token {token} exceeds BIGINT")))?;
            self.changed(
                sqlx::query(
                    "UPDATE leasehold_demo_products SET stock = $2, fence = $3 \
                     WHERE id = $1 AND fence <= $3",
                )
                .bind(product)
                .bind(stock)
                .bind(token),
            )
            .await
        })
    }

    fn write_versioned<'a>(
        &'a self,
        product: &'a str,
        stock: i64,
        version: i64,
    ) -> BoxFuture<'a, Result<bool, CliError>> {
        Box::pin(async move {
            self.changed(
                sqlx::query(
                    "UPDATE leasehold_demo_products SET stock = $2, version = version + 1 \
                     WHERE id = $1 AND version = $3",
                )
                .bind(product)
                .bind(stock)
                .bind(version),
            )
            .await
        })
    }

    fn buy_row_locked<'a>(
        &'a self,
        product: &'a str,
        pay: Duration,
    ) -> BoxFuture<'a, Result<bool, CliError>> {
        Box::pin(async move {
            // Queue on the row (FOR UPDATE), but not forever: a worker stuck
            // behind a wedged transaction should fail the run, not hang it.
            let options = RowLockOptions::new()
                .with_mode(LockMode::Wait)
                .with_lock_timeout(Duration::from_secs(60))
                .with_label(product)
                .with_pooler(self.pooler);
            let persistent = self.pooler != Pooler::Transaction;
            let (key, id) = (product.to_owned(), product.to_owned());
            let sold = with_locked_rows(
                &self.pool,
                &options,
                "SELECT stock FROM leasehold_demo_products WHERE id = $1",
                move |q| q.bind(key),
                move |tx, rows| {
                    Box::pin(async move {
                        let stock: i64 = match rows.first() {
                            Some(row) => row.try_get(0)?,
                            None => return Err(sqlx::Error::RowNotFound),
                        };
                        if stock <= 0 {
                            return Ok(false);
                        }
                        tokio::time::sleep(pay).await;
                        // Writes the value read before the pause, as the
                        // unprotected strategy does: the row lock alone is
                        // what makes this correct.
                        sqlx::query("UPDATE leasehold_demo_products SET stock = $2 WHERE id = $1")
                            .persistent(persistent)
                            .bind(&id)
                            .bind(stock - 1)
                            .execute(&mut *tx)
                            .await?;
                        Ok(true)
                    })
                },
            )
            .await?;
            Ok(sold)
        })
    }
}
