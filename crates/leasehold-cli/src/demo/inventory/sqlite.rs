//! The demo's product row in the SQLite file that holds the locks.

use std::str::FromStr;
use std::time::Duration;

use leasehold::backend::BoxFuture;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use sqlx::Row;

use super::{store_error, Inventory, Stock};
use crate::exit::CliError;

pub struct SqliteInventory {
    pool: SqlitePool,
}

impl SqliteInventory {
    pub async fn open(url: &str) -> Result<Self, CliError> {
        let path = url
            .strip_prefix("sqlite://")
            .map(|rest| rest.split_once('?').map_or(rest, |(p, _)| p))
            .filter(|p| !p.is_empty())
            .ok_or_else(|| CliError::usage(format!("not a sqlite://PATH url: {url:?}")))?;
        // The default store lives in a state directory that may not exist
        // yet on a fresh machine.
        if let Some(parent) = std::path::Path::new(path)
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
        {
            std::fs::create_dir_all(parent).map_err(store_error)?;
        }
        let options = SqliteConnectOptions::from_str("sqlite://")
            .map_err(store_error)?
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // Row-lock workers queue on SQLite's write lock for a while.
            .busy_timeout(Duration::from_secs(60));
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .map_err(store_error)?;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS leasehold_demo_products (
                id TEXT PRIMARY KEY NOT NULL,
                stock INTEGER NOT NULL,
                version INTEGER NOT NULL,
                fence INTEGER NOT NULL
            )",
        )
        .execute(&pool)
        .await
        .map_err(store_error)?;
        Ok(SqliteInventory { pool })
    }

    async fn changed<'q>(
        &self,
        query: sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
    ) -> Result<bool, CliError> {
        let done = query.execute(&self.pool).await.map_err(store_error)?;
        Ok(done.rows_affected() == 1)
    }
}

impl Inventory for SqliteInventory {
    fn reset<'a>(&'a self, product: &'a str, stock: i64) -> BoxFuture<'a, Result<(), CliError>> {
        Box::pin(async move {
            sqlx::query(
                "INSERT INTO leasehold_demo_products (id, stock, version, fence) VALUES (?1, ?2, 0, 0)
                 ON CONFLICT (id) DO UPDATE SET stock = ?2, version = 0, fence = 0",
            )
            .bind(product)
            .bind(stock)
            .execute(&self.pool)
            .await
            .map_err(store_error)?;
            Ok(())
        })
    }

    fn read<'a>(&'a self, product: &'a str) -> BoxFuture<'a, Result<Stock, CliError>> {
        Box::pin(async move {
            let row =
                sqlx::query("SELECT stock, version FROM leasehold_demo_products WHERE id = ?1")
                    .bind(product)
                    .fetch_one(&self.pool)
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
                sqlx::query("UPDATE leasehold_demo_products SET stock = ?2 WHERE id = ?1")
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
            self.changed(
                sqlx::query(
                    "UPDATE leasehold_demo_products SET stock = ?2, fence = ?3 WHERE id = ?1 AND fence <= ?3",
                )
                .bind(product)
                .bind(stock)
                .bind(token as i64),
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
                    "UPDATE leasehold_demo_products SET stock = ?2, version = version + 1 \
                     WHERE id = ?1 AND version = ?3",
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
            // SQLite locks the whole database, not a row: BEGIN IMMEDIATE
            // takes the write lock before the read.
            let mut tx = self
                .pool
                .begin_with("BEGIN IMMEDIATE")
                .await
                .map_err(store_error)?;
            let stock: i64 =
                sqlx::query_scalar("SELECT stock FROM leasehold_demo_products WHERE id = ?1")
                    .bind(product)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(store_error)?;
            if stock <= 0 {
                tx.commit().await.map_err(store_error)?;
                return Ok(false);
            }
            tokio::time::sleep(pay).await;
            sqlx::query("UPDATE leasehold_demo_products SET stock = ?2 WHERE id = ?1")
                .bind(product)
                .bind(stock - 1)
                .execute(&mut *tx)
                .await
                .map_err(store_error)?;
            tx.commit().await.map_err(store_error)?;
            Ok(true)
        })
    }
}
