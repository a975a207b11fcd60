//! A write that only the current lock holder can make, on PostgreSQL.
//!
//! ```sh
//! DATABASE_URL=postgres://postgres@127.0.0.1/test \
//!   cargo run -p leasehold --features postgres --example postgres_fenced_write
//! ```
//!
//! The locks and the data share the application's own pool (built with the
//! re-exported `leasehold::sqlx`). Holder A sells an item; an admin breaks
//! A's lock and holder B takes over and sells one; then A, which still has
//! its guard, tries again and is refused twice over:
//! - by `check_in`, which checks the lease inside A's transaction
//!   (`Error::LeaseLost`, matched in the application's own error type);
//! - by the fence column alone (`WHERE fence <= token` matches no row),
//!   the check that also works when the data lives in another database.

use std::time::Duration;

use leasehold::backends::postgres::{PostgresBackend, PostgresOptions};
use leasehold::sqlx::{self, postgres::PgPoolOptions, PgPool};
use leasehold::{LeaseGuard, Locks};

/// The application's own error type: lock errors and database errors side
/// by side, each converted by `?`.
#[derive(Debug, thiserror::Error)]
enum ShopError {
    #[error(transparent)]
    Lock(#[from] leasehold::Error),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
    #[error("a newer lock holder has written product {0}; this one is stale")]
    Fenced(i64),
    #[error("product {0} is sold out")]
    SoldOut(i64),
}

impl ShopError {
    /// Whether the work was refused because this process's lease is gone.
    fn is_stale_holder(&self) -> bool {
        match self {
            ShopError::Lock(e) => e.is_lease_lost(),
            ShopError::Fenced(_) => true,
            _ => false,
        }
    }
}

const PRODUCT: i64 = 1;
const KEY: &str = "example:product:1";

#[tokio::main]
async fn main() -> Result<(), ShopError> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let pool = PgPoolOptions::new()
        .max_connections(5)
        .connect(&url)
        .await?;
    let backend = PostgresBackend::from_pool(pool.clone(), PostgresOptions::new()).await?;
    set_up(&pool).await?;

    // Two application instances (two `Locks` handles) and an admin.
    let instance_a = Locks::new(backend.clone());
    let instance_b = Locks::new(backend.clone());
    let admin = Locks::new(backend.clone());
    admin.force_release(KEY).await?; // a lock left over from an interrupted run

    let a = instance_a.acquire(KEY, Duration::from_secs(5)).await?;
    println!("A sells: stock now {}", sell_one(&backend, &a).await?);

    admin.force_release(KEY).await?;
    let b = instance_b.acquire(KEY, Duration::from_secs(5)).await?;
    println!("B took over with token {} (A had {})", b.token(), a.token());
    println!("B sells: stock now {}", sell_one(&backend, &b).await?);

    // A does not know yet: its guard learns at its next renewal.
    match sell_one(&backend, &a).await {
        Err(e) if e.is_stale_holder() => println!("A refused by check_in: {e}"),
        other => panic!("a stale holder must be refused, got {other:?}"),
    }
    match fenced_sell(&pool, &a).await {
        Err(e @ ShopError::Fenced(_)) => println!("A refused by the fence column: {e}"),
        other => panic!("the fence must refuse an older token, got {other:?}"),
    }

    b.release().await?;
    drop(a); // already broken: nothing to release
    let stock: i32 =
        sqlx::query_scalar("SELECT stock FROM leasehold_example_products WHERE id = $1")
            .bind(PRODUCT)
            .fetch_one(&pool)
            .await?;
    println!("final stock {stock}: one sale by A, one by B, none by the stale A");
    assert_eq!(stock, 98);
    Ok(())
}

/// Sells one item under `guard`: the lease is checked inside the
/// transaction (the lease row stays locked `FOR SHARE` until commit, so the
/// lease cannot be broken or taken over before the write commits), and the
/// write is fenced too.
async fn sell_one(backend: &PostgresBackend, guard: &LeaseGuard) -> Result<i32, ShopError> {
    let mut tx = backend.pool().begin().await?;
    backend.check_in(&mut tx, guard.lease()).await?;
    let stock = fenced_decrement(&mut tx, guard).await?;
    tx.commit().await?;
    Ok(stock)
}

/// The fenced write alone, without `check_in`.
async fn fenced_sell(pool: &PgPool, guard: &LeaseGuard) -> Result<i32, ShopError> {
    let mut conn = pool.acquire().await?;
    fenced_decrement(&mut conn, guard).await
}

/// `stock - 1`, accepted only for a token at least as new as the last one
/// that wrote the row.
async fn fenced_decrement(
    conn: &mut sqlx::PgConnection,
    guard: &LeaseGuard,
) -> Result<i32, ShopError> {
    let token = i64::try_from(guard.token()).expect("tokens fit in BIGINT");
    let stock: Option<i32> = sqlx::query_scalar(
        "UPDATE leasehold_example_products SET stock = stock - 1, fence = $2 \
         WHERE id = $1 AND fence <= $2 AND stock > 0 RETURNING stock",
    )
    .bind(PRODUCT)
    .bind(token)
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(stock) = stock {
        return Ok(stock);
    }
    // No row updated: sold out, or fenced off by a newer token.
    let fence: i64 =
        sqlx::query_scalar("SELECT fence FROM leasehold_example_products WHERE id = $1")
            .bind(PRODUCT)
            .fetch_one(&mut *conn)
            .await?;
    Err(if fence > token {
        ShopError::Fenced(PRODUCT)
    } else {
        ShopError::SoldOut(PRODUCT)
    })
}

async fn set_up(pool: &PgPool) -> Result<(), sqlx::Error> {
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS leasehold_example_products (
           id    BIGINT PRIMARY KEY,
           stock INT    NOT NULL,
           fence BIGINT NOT NULL DEFAULT 0  -- highest token that wrote the row
         )",
    )
    .execute(pool)
    .await?;
    sqlx::query(
        "INSERT INTO leasehold_example_products (id, stock, fence) VALUES ($1, 100, 0)
         ON CONFLICT (id) DO UPDATE SET stock = 100, fence = 0",
    )
    .bind(PRODUCT)
    .execute(pool)
    .await?;
    Ok(())
}
