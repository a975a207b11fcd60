//! The demo's product row in the SQL database that holds the locks
//! (SQLite, PostgreSQL).
//!
//! The row-lock strategy on PostgreSQL is the library's own
//! [`with_locked_rows`](leasehold::rowlock::with_locked_rows): the demo shows
//! the helper an application would use, not a hand-written transaction. On
//! SQLite, which locks the whole file rather than a row, it is a
//! `BEGIN IMMEDIATE` transaction around the read, the payment and the write.

use std::time::Duration;

use leasehold::rowlock::{with_locked_rows, LockMode, RowLockOptions};
use sqlx::Row;

use super::{store_error, Answer, Check, Inventory, Stock};
use crate::exit::CliError;
use crate::sql::{Arg, BusyTimeout, SqlDb};

const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS leasehold_demo_products (
    id TEXT PRIMARY KEY NOT NULL,
    stock BIGINT NOT NULL,
    version BIGINT NOT NULL,
    fence BIGINT NOT NULL
)";

const READ: &str = "SELECT stock, version FROM leasehold_demo_products WHERE id = $1";
const WRITE: &str = "UPDATE leasehold_demo_products SET stock = $2 WHERE id = $1";

pub struct SqlInventory {
    db: SqlDb,
}

impl SqlInventory {
    /// `None` for a store that is not SQL.
    pub async fn open(url: &str) -> Result<Option<Self>, CliError> {
        // Row-lock workers queue on SQLite's write lock for a while.
        let busy = BusyTimeout(Duration::from_secs(60));
        let Some(db) = SqlDb::open(url, "demo inventory", busy).await? else {
            return Ok(None);
        };
        db.create_tables(&[CREATE_TABLE.to_owned()])
            .await
            .map_err(store_error)?;
        Ok(Some(SqlInventory { db }))
    }

    /// SQLite: the write lock taken before the read, held to the commit.
    async fn buy_in_write_transaction(&self, product: &str, pay: Duration) -> sqlx::Result<bool> {
        let mut tx = self.db.begin_write().await?;
        let stock = tx
            .select_for_update(
                "SELECT stock FROM leasehold_demo_products WHERE id = $1",
                product,
            )
            .await?;
        if stock <= 0 {
            tx.commit().await?;
            return Ok(false);
        }
        tokio::time::sleep(pay).await;
        tx.execute(WRITE, &[Arg::Text(product), Arg::Int(stock - 1)])
            .await?;
        tx.commit().await?;
        Ok(true)
    }
}

impl Inventory for SqlInventory {
    fn reset<'a>(&'a self, product: &'a str, stock: i64) -> Answer<'a, ()> {
        Box::pin(async move {
            self.db
                .execute(
                    "INSERT INTO leasehold_demo_products (id, stock, version, fence) VALUES ($1, $2, 0, 0)
                     ON CONFLICT (id) DO UPDATE SET stock = $2, version = 0, fence = 0",
                    &[Arg::Text(product), Arg::Int(stock)],
                )
                .await
                .map_err(store_error)?;
            Ok(())
        })
    }

    fn read<'a>(&'a self, product: &'a str) -> Answer<'a, Stock> {
        Box::pin(async move {
            let (stock, version) = self
                .db
                .fetch_one(READ, &[Arg::Text(product)])
                .await
                .map_err(store_error)?;
            Ok(Stock { stock, version })
        })
    }

    fn write<'a>(&'a self, product: &'a str, stock: i64, check: Check) -> Answer<'a, bool> {
        Box::pin(async move {
            let (sql, checked) = match check {
                Check::None => (WRITE, None),
                Check::Fence(token) => (
                    "UPDATE leasehold_demo_products SET stock = $2, fence = $3 \
                     WHERE id = $1 AND fence <= $3",
                    Some(i64::try_from(token).map_err(|_| {
                        CliError::usage(format!("fencing token {token} exceeds BIGINT"))
                    })?),
                ),
                Check::Version(version) => (
                    "UPDATE leasehold_demo_products SET stock = $2, version = version + 1 \
                     WHERE id = $1 AND version = $3",
                    Some(version),
                ),
            };
            let mut args = vec![Arg::Text(product), Arg::Int(stock)];
            args.extend(checked.map(Arg::Int));
            let changed = self.db.execute(sql, &args).await.map_err(store_error)?;
            Ok(changed == 1)
        })
    }

    fn buy_row_locked<'a>(&'a self, product: &'a str, pay: Duration) -> Answer<'a, bool> {
        Box::pin(async move {
            let Some((pool, pooler)) = self.db.postgres() else {
                return self
                    .buy_in_write_transaction(product, pay)
                    .await
                    .map_err(store_error);
            };
            // Queue on the row (FOR UPDATE), but not forever: a worker stuck
            // behind a wedged transaction should fail the run, not hang it.
            let options = RowLockOptions::new()
                .with_mode(LockMode::Wait)
                .with_lock_timeout(Duration::from_secs(60))
                .with_label(product)
                .with_pooler(pooler);
            let persistent = self.db.persistent();
            let (key, id) = (product.to_owned(), product.to_owned());
            let sold = with_locked_rows(
                pool,
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
                        sqlx::query(WRITE)
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
