//! PostgreSQL fixtures: the test server, a backend or pool on it, a
//! resource table, another transaction's row lock.
#![allow(dead_code)] // each test crate uses its own subset

use std::time::Duration;

use leasehold::backends::postgres::{PostgresBackend, PostgresOptions};
use leasehold::conformance::{server_url, unblock, Unblock};
use leasehold::sqlx::postgres::{PgConnection, PgPool, PgPoolOptions};
use leasehold::sqlx::{self, Connection};

/// The test server (`LEASEHOLD_TEST_POSTGRES`); `None` skips.
pub fn url() -> Option<String> {
    server_url("LEASEHOLD_TEST_POSTGRES")
}

/// The server's URL at a port where nothing listens.
pub fn url_at_port(port: u16) -> String {
    format!("postgres://postgres@127.0.0.1:{port}/test")
}

pub async fn connect(url: &str) -> PostgresBackend {
    PostgresBackend::connect(url)
        .await
        .expect("connect to the test server")
}

/// A backend on its own `table`, with room in its pool for a transaction
/// that holds a row lock beside the lease operations.
pub async fn on_table(url: &str, table: &str) -> PostgresBackend {
    let options = PostgresOptions::new()
        .with_table(table)
        .with_max_connections(4);
    PostgresBackend::connect_with(url, options)
        .await
        .expect("connect to the test server")
}

pub async fn pool(url: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(8)
        .connect(url)
        .await
        .expect("connect to the test server")
}

/// Drops `table` (a name as SQL takes it: quote mixed case yourself).
pub async fn drop_table(pool: &PgPool, table: &str) {
    sqlx::query(&format!("DROP TABLE IF EXISTS {table}"))
        .execute(pool)
        .await
        .unwrap();
}

/// A resource table for the inventory tests:
/// `products(id, stock, version, fence)` with rows 1 and 2.
pub async fn products(pool: &PgPool, stock: i32) -> String {
    let table = super::common::unique("products");
    sqlx::query(&format!(
        "CREATE TABLE {table} (id BIGINT PRIMARY KEY, stock INT NOT NULL, \
         version BIGINT NOT NULL DEFAULT 0, fence BIGINT NOT NULL DEFAULT 0)"
    ))
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(&format!(
        "INSERT INTO {table} (id, stock) VALUES (1, $1), (2, $1)"
    ))
    .bind(stock)
    .execute(pool)
    .await
    .unwrap();
    table
}

pub async fn stock(pool: &PgPool, table: &str, id: i64) -> i32 {
    sqlx::query_scalar(&format!("SELECT stock FROM {table} WHERE id = $1"))
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Locks `key`'s lease row in `table` FOR SHARE in a transaction on a
/// connection of its own, as `check_in` does, until the returned
/// [`Unblock`] rolls it back.
pub async fn row_lock(url: &str, table: &str, key: &str) -> Unblock {
    let mut conn = PgConnection::connect(url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut conn).await.unwrap();
    let locked = sqlx::query(&format!(
        "SELECT 1 FROM \"{table}\" WHERE key = $1 FOR SHARE"
    ))
    .bind(key)
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(locked.len(), 1, "the lease row exists");
    unblock(move || async move {
        sqlx::query("ROLLBACK").execute(&mut conn).await.unwrap();
        let _ = conn.close().await;
    })
}

/// The options PostgreSQL rejects before connecting, on a server at `down`
/// where nothing listens, as conformance `options` hooks.
pub fn with_bad_options(
    store: leasehold::conformance::TestStore,
    down: String,
) -> leasehold::conformance::TestStore {
    let mut store = store;
    for table in ["", "a.b.c", "x\"; DROP TABLE y; --", "9lives"] {
        let options = PostgresOptions::new().with_table(table);
        let (url, opts) = (down.clone(), options.clone());
        store = store.with_bad_option("table name", move || {
            let (url, opts) = (url.clone(), opts.clone());
            async move { PostgresBackend::connect_with(&url, opts).await }
        });
        let url = down.clone();
        store = store.with_bad_option("table name", move || {
            let (lazy, opts) = (PgPool::connect_lazy(&url).unwrap(), options.clone());
            PostgresBackend::from_pool(lazy, opts)
        });
    }
    let url = down.clone();
    // The listener is a connection of its own: one data connection is
    // fine, none is not.
    store = store.with_bad_option("max_connections", move || {
        let options = PostgresOptions::new().with_max_connections(0);
        let url = url.clone();
        async move { PostgresBackend::connect_with(&url, options).await }
    });
    let url = down.clone();
    store = store.with_bad_option("max_connections", move || {
        let lazy = PgPoolOptions::new()
            .max_connections(1)
            .connect_lazy(&url)
            .unwrap();
        PostgresBackend::from_pool(lazy, PostgresOptions::new())
    });
    let url = down.clone();
    store = store.with_bad_option("listen url", move || {
        let options = PostgresOptions::new().with_listen_url("mysql://x");
        let url = url.clone();
        async move { PostgresBackend::connect_with(&url, options).await }
    });
    let url = down;
    store = store.with_bad_option("acquire_timeout", move || {
        let options = PostgresOptions::new().with_acquire_timeout(Duration::ZERO);
        let url = url.clone();
        async move { PostgresBackend::connect_with(&url, options).await }
    });
    // The error names the URL's problem without its password.
    store.with_bad_option("store url", || {
        PostgresBackend::connect("postgres://u:secret@h:notaport/db")
    })
}
