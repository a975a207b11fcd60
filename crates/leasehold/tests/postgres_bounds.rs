//! PostgreSQL at the edges of the lease beyond the conformance suite's
//! `blocking` group: a lease row locked by `check_in` leaves no session
//! setting behind and makes the HTTP layer's reject mode answer 409 at
//! once, and a black-holed connection does not take a renewal with it.
//! Against the real server in `LEASEHOLD_TEST_POSTGRES` (skipped without
//! it, unless `LEASEHOLD_REQUIRE_SERVERS=1`).
#![cfg(all(feature = "conformance", feature = "postgres"))]

mod blackhole;
#[path = "support/common.rs"]
mod common;
#[path = "support/postgres.rs"]
mod postgres;

use std::time::Duration;

use common::unique;
use leasehold::backends::postgres::{PostgresBackend, PostgresOptions};
use leasehold::{Error, Locks};
use postgres::{drop_table, on_table, url};
use tokio::time::Instant;

/// Slack for "one round trip" on a loaded 2-core machine.
const ROUND_TRIP_SLACK: Duration = Duration::from_millis(700);

/// A new lease table on the test server, the store on it and a `Locks`
/// over that store; `None` (the test skips) without a server.
async fn store_on_new_table() -> Option<(String, PostgresBackend, Locks)> {
    let table = unique("bounds");
    let backend = on_table(&url()?, &table).await;
    let locks = Locks::new(backend.clone());
    Some((table, backend, locks))
}

/// A try-once call on a row that `check_in` locked answers busy, and the
/// bounded lock wait it used is local to its statement: no connection of
/// the pool keeps a `lock_timeout`.
#[tokio::test]
async fn a_bounded_lock_wait_leaves_no_session_setting() {
    let Some((table, backend, locks)) = store_on_new_table().await else {
        return;
    };
    let key = unique("checked_in");
    let holder = locks.try_acquire(&key).await.unwrap();
    let mut tx = backend.pool().begin().await.unwrap();
    backend.check_in(&mut tx, holder.lease()).await.unwrap();
    let outcome = locks.try_acquire(&key).await;
    assert!(matches!(outcome, Err(Error::Busy { .. })), "{outcome:?}");
    tx.commit().await.unwrap();
    holder.release().await.unwrap();
    let mut pooled = Vec::new();
    for _ in 0..backend.pool().size() {
        let Some(mut conn) = backend.pool().try_acquire() else {
            break;
        };
        let lock_timeout: String = sqlx::query_scalar("SHOW lock_timeout")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        assert_eq!(lock_timeout, "0");
        pooled.push(conn);
    }
    assert!(!pooled.is_empty(), "the pool has idle connections");
    drop(pooled);
    drop_table(backend.pool(), &format!("\"{table}\"")).await;
}

#[tokio::test]
async fn a_black_holed_connection_does_not_lose_the_lease() {
    let Some(url) = url() else { return };
    let (proxy, direct) = blackhole::in_front_of_postgres(&url).await;
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
    let checker = on_table(&url, &table).await;
    blackhole::renewals_outlive_frozen_connections(&locks, &proxy, &key, &checker).await;
    drop_table(checker.pool(), &format!("\"{table}\"")).await;
}

#[cfg(feature = "http")]
#[tokio::test]
async fn reject_mode_answers_409_at_once_while_the_row_is_checked_in() {
    use http::{Request, Response, StatusCode};
    use leasehold::http::{LeaseLayer, Mode};
    use tower::{Layer, ServiceExt};

    let Some((table, backend, locks)) = store_on_new_table().await else {
        return;
    };
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
    drop_table(backend.pool(), &format!("\"{table}\"")).await;
}

/// A server that accepts the connection and never answers: `Locks::open`
/// fails with a retryable `Unavailable` within the acquire timeout, as
/// docs/postgres.md promises (no server needed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_server_is_unavailable_within_the_acquire_timeout() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            open.push(socket);
        }
    });
    let bound = Duration::from_secs(1);
    let started = Instant::now();
    let outcome = Locks::open(&format!(
        "postgres://u@127.0.0.1:{port}/db?acquire_timeout=1s"
    ))
    .await;
    let took = started.elapsed();
    held.abort();
    let Err(err) = outcome else {
        panic!("a silent server is not a store");
    };
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert!(err.is_retryable());
    assert!(
        took < bound + ROUND_TRIP_SLACK,
        "took {took:?} with acquire_timeout {bound:?}"
    );
}
