//! PostgreSQL's row-lock and optimistic helpers on a resource table: lock
//! modes and lock timeout, no oversell, rollback on error, retried
//! conflicts. Against the real server in `LEASEHOLD_TEST_POSTGRES`
//! (skipped without it, unless `LEASEHOLD_REQUIRE_SERVERS=1`).
#![cfg(all(feature = "conformance", feature = "postgres"))]

#[path = "support/common.rs"]
mod common;
#[path = "support/postgres.rs"]
mod postgres;

use std::future::Future;
use std::time::Duration;

use leasehold::occ::{Attempt, RetryError, RetryPolicy};
use leasehold::rowlock::{
    retry_transaction, with_locked_rows, Isolation, LockMode, RowLockOptions,
};
use leasehold::Error;
use postgres::{drop_table, pool, products, stock, url};
use sqlx::postgres::PgPool;
use sqlx::Row;
use tokio::time::sleep;

/// Runs `test` on a new products table on the test server (see
/// [`products`]) and a pool to it, then drops the table; skips without a
/// server. (A failing test leaves its uniquely named table behind.)
async fn on_products_table<T, F>(stock: i32, test: T)
where
    T: FnOnce(PgPool, String) -> F,
    F: Future<Output = ()>,
{
    let Some(url) = url() else {
        return;
    };
    let pool = pool(&url).await;
    let table = products(&pool, stock).await;
    test(pool.clone(), table.clone()).await;
    drop_table(&pool, &table).await;
}

/// Holds a row lock on `products.id = 1` in an open transaction.
async fn lock_row(pool: &PgPool, table: &str) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(&format!("SELECT 1 FROM {table} WHERE id = 1 FOR UPDATE"))
        .execute(&mut *tx)
        .await
        .unwrap();
    tx
}

/// Locks product 1 (`select_one` binds its id) under `options` and does
/// nothing with it.
async fn lock_product_1(
    pool: &PgPool,
    options: &RowLockOptions,
    select_one: &str,
) -> Result<(), Error> {
    with_locked_rows(
        pool,
        options,
        select_one,
        |q| q.bind(1_i64),
        |_, _| Box::pin(async { Ok(()) }),
    )
    .await
}

#[tokio::test]
async fn row_lock_modes_and_lock_timeout() {
    on_products_table(10, |pool, table| async move {
        let select = format!("SELECT id FROM {table} ORDER BY id");
        let select_one = format!("SELECT id FROM {table} WHERE id = $1");
        let held = lock_row(&pool, &table).await;

        let nowait = RowLockOptions::new()
            .with_mode(LockMode::NoWait)
            .with_label("products:1");
        let result = lock_product_1(&pool, &nowait, &select_one).await;
        match result {
            Err(Error::Busy { key, holder, .. }) => {
                assert_eq!(
                    (key.as_str(), holder.as_str()),
                    ("products:1", "another transaction")
                )
            }
            other => panic!("NOWAIT on a locked row: expected Busy, got {other:?}"),
        }

        let bounded = RowLockOptions::new().with_lock_timeout(Duration::from_millis(200));
        let result = lock_product_1(&pool, &bounded, &select_one).await;
        assert!(matches!(result, Err(Error::Busy { .. })), "{result:?}");

        let skip = RowLockOptions::new().with_mode(LockMode::SkipLocked);
        let ids: Vec<i64> = with_locked_rows(
            &pool,
            &skip,
            &select,
            |q| q,
            |_, rows| {
                Box::pin(async move { rows.iter().map(|r| r.try_get::<i64, _>(0)).collect() })
            },
        )
        .await
        .unwrap();
        assert_eq!(ids, vec![2_i64], "the locked row is skipped");

        held.rollback().await.unwrap();
        let bad = RowLockOptions::new().with_lock_timeout(Duration::ZERO);
        assert!(matches!(
            with_locked_rows(
                &pool,
                &bad,
                &select,
                |q| q,
                |_, _| Box::pin(async { Ok(()) })
            )
            .await,
            Err(Error::InvalidInput {
                what: "lock_timeout",
                ..
            })
        ));
    })
    .await;
}

#[tokio::test]
async fn row_lock_sells_exactly_the_stock_and_rolls_back_on_error() {
    on_products_table(5, |pool, table| async move {
        let select = format!("SELECT stock FROM {table} WHERE id = $1");
        let update = format!("UPDATE {table} SET stock = stock - 1 WHERE id = $1");
        let buyers = (0..12).map(|_| {
            let (pool, select, update) = (pool.clone(), select.clone(), update.clone());
            tokio::spawn(async move {
                with_locked_rows(
                    &pool,
                    &RowLockOptions::new(),
                    &select,
                    |q| q.bind(1_i64),
                    |tx, rows| {
                        Box::pin(async move {
                            let stock: i32 = rows[0].try_get(0)?;
                            // Widen the read-then-write window: without the row lock
                            // concurrent buyers would all see the same stock.
                            sleep(Duration::from_millis(5)).await;
                            if stock == 0 {
                                return Ok(false);
                            }
                            sqlx::query(&update).bind(1_i64).execute(&mut *tx).await?;
                            Ok(true)
                        })
                    },
                )
                .await
            })
        });
        let mut sold = 0;
        for b in buyers.collect::<Vec<_>>() {
            sold += b.await.unwrap().unwrap() as i32;
        }
        assert_eq!((sold, stock(&pool, &table, 1).await), (5, 0), "no oversell");

        // An error from the closure rolls its writes back.
        let result = with_locked_rows(
            &pool,
            &RowLockOptions::new(),
            &select,
            |q| q.bind(2_i64),
            |tx, _| {
                let update = update.clone();
                Box::pin(async move {
                    sqlx::query(&update).bind(2_i64).execute(&mut *tx).await?;
                    sqlx::query("SELECT 1/0").execute(&mut *tx).await?;
                    Ok(())
                })
            },
        )
        .await;
        assert!(matches!(result, Err(Error::Backend { .. })), "{result:?}");
        assert_eq!(stock(&pool, &table, 2).await, 5);
    })
    .await;
}

#[tokio::test]
async fn optimistic_retries_version_conflicts_and_serialization_failures() {
    on_products_table(10, |pool, table| async move {
        let read = format!("SELECT stock, version FROM {table} WHERE id = $1");
        let write = format!(
            "UPDATE {table} SET stock = $3, version = version + 1 WHERE id = $1 AND version = $2"
        );
        let interfere = format!("UPDATE {table} SET version = version + 1 WHERE id = $1");

        for isolation in [Isolation::ReadCommitted, Isolation::Serializable] {
            let before = stock(&pool, &table, 1).await;
            let done =
                retry_transaction(&pool, &RetryPolicy::default(), isolation, |tx, attempt| {
                    let (read, write, interfere, pool) =
                        (read.clone(), write.clone(), interfere.clone(), pool.clone());
                    Box::pin(async move {
                        let (stock, version): (i32, i64) = sqlx::query_as(&read)
                            .bind(1_i64)
                            .fetch_one(&mut *tx)
                            .await?;
                        if attempt == 1 {
                            // Another writer commits between our read and write.
                            sqlx::query(&interfere).bind(1_i64).execute(&pool).await?;
                        }
                        let done = sqlx::query(&write)
                            .bind(1_i64)
                            .bind(version)
                            .bind(stock - 1)
                            .execute(&mut *tx)
                            .await?;
                        Ok(if done.rows_affected() == 0 {
                            Attempt::Conflict
                        } else {
                            Attempt::Committed(stock - 1)
                        })
                    })
                })
                .await
                .unwrap_or_else(|e| panic!("{isolation:?}: {e}"));
            // READ COMMITTED sees the new version and matches 0 rows (conflict);
            // SERIALIZABLE fails the write with 40001 (transient). Both retry.
            assert_eq!(done.attempts, 2, "{isolation:?}");
            assert_eq!(done.value, before - 1);
            assert_eq!(stock(&pool, &table, 1).await, before - 1);
        }

        let policy =
            RetryPolicy::new(3, Duration::from_millis(1), Duration::from_millis(2)).unwrap();
        let gave_up = retry_transaction(&pool, &policy, Isolation::ReadCommitted, |_, _| {
            Box::pin(async { Ok(Attempt::<()>::Conflict) })
        })
        .await;
        assert!(matches!(
            gave_up,
            Err(RetryError::Exhausted { attempts: 3 })
        ));
        let failed = retry_transaction(&pool, &policy, Isolation::ReadCommitted, |tx, _| {
            Box::pin(async move {
                sqlx::query("SELECT * FROM no_such_table_here")
                    .execute(&mut *tx)
                    .await?;
                Ok(Attempt::Committed(()))
            })
        })
        .await;
        assert!(
            matches!(failed, Err(RetryError::Failed { attempts: 1, .. })),
            "a permanent error is not retried"
        );
    })
    .await;
}
