//! PostgreSQL at the edges of the lease: a lease row locked by another
//! transaction (as `check_in` locks it) bounds neither a wait nor a
//! try-once call beyond the caller's bound, a grant that waited for such a
//! lock is not born expired, and a black-holed connection does not take a
//! renewal with it. Against the real server in `LEASEHOLD_TEST_POSTGRES`
//! (skipped without it, unless `LEASEHOLD_REQUIRE_SERVERS=1`).
#![cfg(all(feature = "conformance", feature = "postgres"))]

mod blackhole;

use std::net::ToSocketAddrs;
use std::str::FromStr;
use std::time::Duration;

use blackhole::BlackholeProxy;
use leasehold::backend::{Acquire, AcquireRequest};
use leasehold::backends::postgres::{PostgresBackend, PostgresOptions};
use leasehold::conformance::server_url;
use leasehold::{AcquireOptions, Backend, Error, Key, Locks};
use sqlx::postgres::PgConnectOptions;
use tokio::time::{sleep, timeout, Instant};

/// Slack for "one round trip" on a loaded 2-core machine. The old code
/// blocked until the row lock was released (seconds here), so the bound
/// still tells the two apart.
const ROUND_TRIP_SLACK: Duration = Duration::from_millis(700);

/// How long the tests keep a row locked: far beyond every bound asserted.
const ROW_LOCK_HELD: Duration = Duration::from_secs(6);

fn url() -> Option<String> {
    server_url("LEASEHOLD_TEST_POSTGRES")
}

fn unique(prefix: &str) -> String {
    format!("{prefix}_{:016x}", rand::random::<u64>())
}

/// A backend on its own table, so the tests see only their own rows, with
/// room in its pool for a transaction that holds a row lock beside the
/// lease operations.
async fn backend(url: &str, table: &str) -> PostgresBackend {
    let options = PostgresOptions::new()
        .with_table(table)
        .with_max_connections(4);
    PostgresBackend::connect_with(url, options)
        .await
        .expect("connect to LEASEHOLD_TEST_POSTGRES")
}

async fn drop_table(backend: &PostgresBackend, table: &str) {
    sqlx::query(&format!("DROP TABLE IF EXISTS \"{table}\""))
        .execute(backend.pool())
        .await
        .unwrap();
}

/// Locks `key`'s lease row FOR SHARE in a transaction on its own connection
/// and keeps it for `held` (then rolls back): another transaction's row
/// lock, like the one `check_in` takes.
async fn hold_row_lock(
    backend: &PostgresBackend,
    table: &str,
    key: &str,
    held: Duration,
) -> tokio::task::JoinHandle<()> {
    let mut tx = backend.pool().begin().await.unwrap();
    let locked = sqlx::query(&format!(
        "SELECT 1 FROM \"{table}\" WHERE key = $1 FOR SHARE"
    ))
    .bind(key)
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    assert_eq!(locked.len(), 1, "the lease row exists");
    tokio::spawn(async move {
        sleep(held).await;
        tx.rollback().await.unwrap();
    })
}

#[tokio::test]
async fn a_row_locked_by_check_in_bounds_waits_and_try_once_calls() {
    let Some(url) = url() else { return };
    let table = unique("bounds");
    let backend = backend(&url, &table).await;
    let locks = Locks::new(backend.clone());
    let key = unique("checked_in");
    let holder = locks.try_acquire(&key).await.unwrap();
    // The holder writes in a transaction that checked its lease in: the
    // lease row is locked FOR SHARE until that transaction ends.
    let mut tx = backend.pool().begin().await.unwrap();
    backend.check_in(&mut tx, holder.lease()).await.unwrap();

    let wait = Duration::from_millis(300);
    let started = Instant::now();
    let outcome = timeout(ROW_LOCK_HELD, locks.acquire(&key, wait))
        .await
        .expect("the wait ends while the row is still locked");
    let took = started.elapsed();
    assert!(matches!(outcome, Err(Error::Timeout { .. })), "{outcome:?}");
    assert!(
        took < wait + ROUND_TRIP_SLACK,
        "wait of {wait:?} took {took:?}"
    );

    let started = Instant::now();
    let outcome = timeout(ROW_LOCK_HELD, locks.try_acquire(&key))
        .await
        .expect("a try-once call ends while the row is still locked");
    let took = started.elapsed();
    // Busy (the HTTP layer's reject mode answers 409), not a store error.
    assert!(matches!(outcome, Err(Error::Busy { .. })), "{outcome:?}");
    assert!(took < ROUND_TRIP_SLACK, "try-once took {took:?}");

    tx.commit().await.unwrap();
    holder.release().await.unwrap();
    // Nothing left behind: the key is free and the session has no leftover
    // lock_timeout (the setting was local to the statement's transaction).
    let next = locks.try_acquire(&key).await.expect("free again");
    let lock_timeout: String = sqlx::query_scalar("SHOW lock_timeout")
        .fetch_one(backend.pool())
        .await
        .unwrap();
    assert_eq!(lock_timeout, "0");
    next.release().await.unwrap();
    drop_table(&backend, &table).await;
}

#[tokio::test]
async fn a_grant_that_waited_on_a_row_lock_expires_a_ttl_after_it_was_taken() {
    let Some(url) = url() else { return };
    let table = unique("bounds");
    let backend = backend(&url, &table).await;
    let key = Key::new(unique("late")).unwrap();
    let ttl = Duration::from_secs(1);
    // An expired lease: the row exists and is free to take.
    let first = AcquireRequest::new(key.clone(), Duration::from_millis(100), "first").unwrap();
    assert!(matches!(
        backend.try_acquire(&first).await.unwrap(),
        Acquire::Granted(_)
    ));
    sleep(Duration::from_millis(200)).await;
    // Another transaction keeps the row locked for longer than the ttl.
    let locked_for = ttl + Duration::from_millis(800);
    let unlock = hold_row_lock(&backend, &table, key.as_str(), locked_for).await;

    let req = AcquireRequest::new(key.clone(), ttl, "second")
        .unwrap()
        .with_lock_deadline(Instant::now() + Duration::from_secs(10));
    let started = Instant::now();
    let granted = backend.try_acquire(&req).await.unwrap();
    assert!(matches!(granted, Acquire::Granted(_)), "{granted:?}");
    assert!(
        started.elapsed() >= locked_for - Duration::from_millis(100),
        "the grant waited for the row lock"
    );
    // The expiry was computed when the row was taken, not before the wait.
    let remaining_ms: f64 = sqlx::query_scalar(&format!(
        "SELECT (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::float8 \
         FROM \"{table}\" WHERE key = $1"
    ))
    .bind(key.as_str())
    .fetch_one(backend.pool())
    .await
    .unwrap();
    assert!(
        remaining_ms > 0.0,
        "granted already expired: {remaining_ms} ms left at the store"
    );
    unlock.await.unwrap();

    // Through the core, the guard it hands out after such a wait is live.
    let key2 = unique("late_core");
    let locks = Locks::new(backend.clone());
    drop(locks.try_acquire(&key2).await.unwrap());
    sleep(Duration::from_millis(100)).await;
    let unlock = hold_row_lock(&backend, &table, &key2, locked_for).await;
    let options = AcquireOptions::new()
        .with_ttl(ttl)
        .with_wait(Duration::from_secs(10));
    let guard = locks.acquire_with(&key2, &options).await.unwrap();
    assert!(!guard.is_lost(), "a guard is never born lost");
    let live = locks
        .inspect(&key2)
        .await
        .unwrap()
        .expect("held at the store");
    assert_eq!(live.token, guard.token());
    guard.release().await.unwrap();
    unlock.await.unwrap();
    drop_table(&backend, &table).await;
}

#[tokio::test]
async fn a_black_holed_connection_does_not_lose_the_lease() {
    let Some(url) = url() else { return };
    let direct = PgConnectOptions::from_str(&url).unwrap();
    let upstream = (direct.get_host(), direct.get_port())
        .to_socket_addrs()
        .unwrap()
        .next()
        .unwrap();
    let proxy = BlackholeProxy::start(upstream).await;
    let proxied = direct.clone().host("127.0.0.1").port(proxy.addr().port());
    let table = unique("bounds");
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect_with(proxied)
        .await
        .unwrap();
    let through_proxy = PostgresBackend::from_pool(pool, PostgresOptions::new().with_table(&table))
        .await
        .unwrap();
    let locks = Locks::new(through_proxy);
    let key = unique("renewed");
    let ttl = Duration::from_secs(3);
    let guard = locks
        .acquire_with(&key, &AcquireOptions::new().with_ttl(ttl))
        .await
        .unwrap();
    // Every connection the pool has now goes dead without closing; new
    // connections get through.
    assert!(proxy.freeze_existing() >= 1);
    sleep(ttl * 2).await;
    assert!(
        !guard.is_lost(),
        "a renewal stuck on a dead connection was not retried on a fresh one"
    );
    let checker = backend(&url, &table).await;
    let held = checker
        .inspect(&Key::new(key.clone()).unwrap())
        .await
        .unwrap()
        .expect("still held at the store");
    assert_eq!(held.token, guard.token());
    assert!(
        held.remaining > ttl / 3,
        "renewed: {:?} left",
        held.remaining
    );
    drop(guard);
    drop_table(&checker, &table).await;
}

#[cfg(feature = "http")]
#[tokio::test]
async fn reject_mode_answers_409_at_once_while_the_row_is_checked_in() {
    use http::{Request, Response, StatusCode};
    use leasehold::http::{LeaseLayer, Mode};
    use tower::{Layer, ServiceExt};

    let Some(url) = url() else { return };
    let table = unique("bounds");
    let backend = backend(&url, &table).await;
    let locks = Locks::new(backend.clone());
    let key = unique("http");
    let app = LeaseLayer::builder(locks.clone())
        .with_mode(Mode::Reject)
        .with_key({
            let key = key.clone();
            move |_: &Request<String>| Some(key.clone())
        })
        .build()
        .unwrap()
        .layer(tower::service_fn(|_: Request<String>| async {
            Ok::<_, std::convert::Infallible>(Response::new(String::new()))
        }));
    let holder = locks.try_acquire(&key).await.unwrap();
    let mut tx = backend.pool().begin().await.unwrap();
    backend.check_in(&mut tx, holder.lease()).await.unwrap();

    let started = Instant::now();
    let response = app
        .oneshot(Request::post("/").body(String::new()).unwrap())
        .await
        .unwrap();
    let took = started.elapsed();
    // Locked, not a store failure (503 after the store timeout).
    assert_eq!(response.status(), StatusCode::CONFLICT);
    assert!(took < ROUND_TRIP_SLACK, "409 took {took:?}");

    tx.commit().await.unwrap();
    holder.release().await.unwrap();
    drop_table(&backend, &table).await;
}
