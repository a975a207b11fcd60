//! A lock client keeps within its connection budget and stays graceful when
//! the server has no connection left.
//!
//! The count test runs on the shared server (`LEASEHOLD_TEST_POSTGRES`,
//! connections told apart by `application_name`); the pressure tests start
//! a private cluster with a small `max_connections` (see
//! `support/private_pg.rs`), skipped where PostgreSQL's binaries are missing.
#![cfg(all(feature = "conformance", feature = "postgres"))]

#[path = "support/private_pg.rs"]
mod private_pg;

use std::time::Duration;

use leasehold::backend::{Acquire, AcquireRequest};
use leasehold::backends::postgres::{PostgresBackend, PostgresOptions};
use leasehold::conformance::server_url;
use leasehold::{AcquireOptions, Backend, Error, Key, Locks};
use private_pg::Cluster;
use sqlx::{Connection, PgConnection};
use tokio::time::{sleep, Instant};

fn unique(prefix: &str) -> String {
    format!("{prefix}_{:016x}", rand::random::<u64>())
}

/// `url` with `application_name` set, so its connections can be counted.
fn tagged(url: &str, app: &str, extra: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}application_name={app}{extra}")
}

async fn connections_of(probe: &mut PgConnection, app: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1")
        .bind(app)
        .fetch_one(probe)
        .await
        .unwrap()
}

async fn hold(backend: &dyn Backend, key: &str, ttl: Duration) {
    let req = AcquireRequest::new(Key::new(key).unwrap(), ttl, "holder").unwrap();
    match backend.try_acquire(&req).await.unwrap() {
        Acquire::Granted(_) => {}
        Acquire::Busy(b) => panic!("{key} is held: {b:?}"),
    }
}

/// Three `Locks` on one URL, each with waiters, hold one data connection
/// each and share one listener; once idle, only the listener is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_on_one_url_share_one_listener_and_release_idle_connections() {
    let Some(base) = server_url("LEASEHOLD_TEST_POSTGRES") else {
        return;
    };
    let app = unique("budget");
    let url = tagged(&base, &app, "&idle_timeout=300ms");
    let mut probe = PgConnection::connect(&base).await.unwrap();
    let mut all = Vec::new();
    for _ in 0..3 {
        all.push(Locks::open(&url).await.unwrap());
    }
    let key = unique("budget-key");
    let holder = PostgresBackend::connect(&base).await.unwrap();
    hold(&holder, &key, Duration::from_secs(2)).await;

    let mut waiters = Vec::new();
    for locks in &all {
        for _ in 0..3 {
            let (locks, key) = (locks.clone(), key.clone());
            waiters.push(tokio::spawn(async move {
                let options = AcquireOptions::new()
                    .with_ttl(Duration::from_secs(1))
                    .with_wait(Duration::from_millis(700));
                locks.acquire_with(&key, &options).await
            }));
        }
    }
    // While nine waiters wait: 3 data connections at most and 1 listener.
    let mut peak = 0;
    let until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < until {
        peak = peak.max(connections_of(&mut probe, &app).await);
        sleep(Duration::from_millis(20)).await;
    }
    for w in waiters {
        assert!(matches!(w.await.unwrap(), Err(Error::Timeout { .. })));
    }
    assert!(peak >= 1, "the shared listener is up while they wait");
    assert!(
        peak <= 4,
        "3 backends with 1 data connection each and one shared listener, saw {peak}"
    );
    // Idle data connections go within two idle timeouts; the listener stays.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = connections_of(&mut probe, &app).await;
        if now == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{now} connections left, expected only the listener"
        );
        sleep(Duration::from_millis(100)).await;
    }
    drop(all);
}

/// Opens connections to `url` until the server refuses one; returns them.
async fn fill(url: &str) -> Vec<PgConnection> {
    let mut held = Vec::new();
    loop {
        match PgConnection::connect(url).await {
            Ok(c) => held.push(c),
            Err(e) => {
                assert!(e.to_string().contains("too many clients"), "{e}");
                return held;
            }
        }
        assert!(held.len() < 100, "the server never refused a connection");
    }
}

/// The server is full: an operation that needs a new connection fails
/// quickly with a retryable error that names the cause, instead of after
/// the pool's timeout as "pool timed out".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_server_gives_a_quick_retryable_error() {
    let Some(cluster) =
        Cluster::start_private(&["max_connections=6", "superuser_reserved_connections=0"])
    else {
        return;
    };
    let options = PostgresOptions::new().with_idle_timeout(Duration::from_millis(100));
    let backend = PostgresBackend::connect_with(&cluster.url(), options)
        .await
        .unwrap();
    // Its connection from the migration is closed when idle.
    sleep(Duration::from_millis(400)).await;
    let _held = fill(&cluster.url()).await;
    let req = AcquireRequest::new(Key::new("full").unwrap(), Duration::from_secs(1), "t").unwrap();
    let started = Instant::now();
    let e = backend.try_acquire(&req).await.unwrap_err();
    let took = started.elapsed();
    eprintln!("refused after {took:?}: {e}");
    assert!(e.is_retryable(), "{e}");
    assert!(e.to_string().contains("too many clients"), "{e}");
    // The pool's own timeout is 5 s; the probe answers in a round trip
    // after 250 ms. The slack is for a loaded machine.
    assert!(took < Duration::from_secs(2), "took {took:?}");
}

/// The server is full: waiters fall back to polling and the listener
/// tries to connect only a few times (backing off), not in a loop; once a
/// connection is free again, a waiter gets the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_backs_off_while_the_server_is_full() {
    let Some(cluster) = Cluster::start_private(&[
        "max_connections=6",
        "superuser_reserved_connections=0",
        "log_connections=on",
    ]) else {
        return;
    };
    let url = cluster.url();
    let holder = PostgresBackend::connect(&url).await.unwrap();
    hold(&holder, "contended", Duration::from_millis(2500)).await;
    let waiter = Locks::new(PostgresBackend::connect(&url).await.unwrap());
    let mut held = fill(&url).await;
    let refusals_before = cluster.log().matches("too many clients").count();

    // Four waiters, each asking again and again for 2 s.
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let waiter = waiter.clone();
        tasks.push(tokio::spawn(async move {
            let options = AcquireOptions::new()
                .with_ttl(Duration::from_secs(1))
                .with_wait(Duration::from_millis(100));
            let until = Instant::now() + Duration::from_secs(2);
            while Instant::now() < until {
                match waiter.acquire_with("contended", &options).await {
                    Err(Error::Timeout { .. }) => {}
                    other => panic!("expected a timeout while the key is held: {other:?}"),
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let refused = cluster.log().matches("too many clients").count() - refusals_before;
    eprintln!("listener connection attempts refused in 2 s: {refused}");
    // The first start: the pool's own retries for 250 ms (sqlx: 10 ms
    // doubling, about 5 attempts), then one direct attempt that fails it;
    // later starts are one attempt each, 1 s then 2 s apart (with jitter,
    // at least half that): at most 8, and 2 for a last waiter asking just
    // as the 2 s end. A retry per waiter and attempt makes dozens.
    assert!(
        (1..=10).contains(&refused),
        "the listener was refused {refused} times in 2 s"
    );

    // Room again: a waiter still gets the key once the holder's lease ends
    // (polling if need be).
    held.truncate(held.len() - 2);
    let options = AcquireOptions::new()
        .with_ttl(Duration::from_secs(1))
        .with_wait(Duration::from_secs(5));
    let guard = waiter.acquire_with("contended", &options).await.unwrap();
    guard.release().await.unwrap();
}
