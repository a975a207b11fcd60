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

/// A store URL on the shared test server tagged with a fresh
/// `application_name` (plus `extra` options), and a probe that counts the
/// server connections carrying that tag; `None` to skip.
struct Counted {
    base: String,
    url: String,
    app: String,
    probe: PgConnection,
}

impl Counted {
    async fn new(tag: &str, extra: &str) -> Option<Self> {
        let base = server_url("LEASEHOLD_TEST_POSTGRES")?;
        let app = unique(tag);
        let url = tagged(&base, &app, extra);
        let probe = PgConnection::connect(&base).await.unwrap();
        Some(Counted {
            base,
            url,
            app,
            probe,
        })
    }

    async fn connections(&mut self) -> i64 {
        connections_of(&mut self.probe, &self.app).await
    }

    /// The most connections seen in samples every 20 ms for `window`.
    async fn peak_over(&mut self, window: Duration) -> i64 {
        let mut peak = 0;
        let until = Instant::now() + window;
        while Instant::now() < until {
            peak = peak.max(self.connections().await);
            sleep(Duration::from_millis(20)).await;
        }
        peak
    }
}

async fn hold(backend: &dyn Backend, key: &str, ttl: Duration) {
    let req = AcquireRequest::new(Key::new(key).unwrap(), ttl, "holder").unwrap();
    match backend.try_acquire(&req).await.unwrap() {
        Acquire::Granted(_) => {}
        b => panic!("{key} is not granted: {b:?}"),
    }
}

/// A private cluster of 6 connections, none reserved, that logs every
/// connection: easy to fill, and the log counts the attempts.
fn small_cluster() -> Option<Cluster> {
    Cluster::start_private(&[
        "max_connections=6",
        "superuser_reserved_connections=0",
        "log_connections=on",
    ])
}

/// A small cluster, its URL, and a holder (its connection open) of the key
/// `contended` for `ttl`.
async fn small_cluster_with_a_holder(ttl: Duration) -> Option<(Cluster, String, PostgresBackend)> {
    let cluster = small_cluster()?;
    let url = cluster.url();
    let holder = PostgresBackend::connect(&url).await.unwrap();
    hold(&holder, "contended", ttl).await;
    Some((cluster, url, holder))
}

/// Three `Locks` on one URL, each with waiters, share one connection at
/// the default settings: it carries their statements and their `LISTEN`.
/// Once nobody waits and it has been idle for `idle_timeout`, it closes, so
/// an idle process holds none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_on_one_url_share_one_connection_and_close_it_when_idle() {
    let Some(mut counted) = Counted::new("budget", "&idle_timeout=300ms").await else {
        return;
    };
    let (base, url) = (counted.base.clone(), counted.url.clone());
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
    // While nine waiters wait, and their statements run: one connection.
    let peak = counted.peak_over(Duration::from_millis(500)).await;
    for w in waiters {
        assert!(matches!(w.await.unwrap(), Err(Error::Timeout { .. })));
    }
    assert_eq!(
        peak, 1,
        "3 backends with waiters on one URL share one connection"
    );
    // A statement after the waiters left keeps it open for another idle
    // timeout; then it closes.
    all[0].inspect(&key).await.unwrap();
    assert_eq!(counted.connections().await, 1);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = counted.connections().await;
        if now == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{now} connections left after the idle timeout, expected none"
        );
        sleep(Duration::from_millis(100)).await;
    }
    // The next operation connects again.
    assert!(all[1].inspect(&key).await.unwrap().is_some());
    drop(all);
}

/// `max_connections=3`: the lock statements get a pool of their own and the
/// listener a connection beside it, as documented (3 + 1 at most).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_its_own_when_asked_for() {
    let Some(mut counted) = Counted::new("budget_pool", "&max_connections=3").await else {
        return;
    };
    let (base, url) = (counted.base.clone(), counted.url.clone());
    let locks = Locks::open(&url).await.unwrap();
    let key = unique("budget-pool-key");
    let holder = PostgresBackend::connect(&base).await.unwrap();
    hold(&holder, &key, Duration::from_secs(2)).await;
    let mut waiters = Vec::new();
    for i in 0..6 {
        let locks = locks.clone();
        // Different keys: each waits at the store, not behind a local turn.
        let key = if i == 0 {
            key.clone()
        } else {
            format!("{key}-{i}")
        };
        waiters.push(tokio::spawn(async move {
            let options = AcquireOptions::new().with_wait(Duration::from_millis(600));
            locks.acquire_with(&key, &options).await.map(drop)
        }));
    }
    let peak = counted.peak_over(Duration::from_millis(400)).await;
    for w in waiters {
        let _ = w.await.unwrap();
    }
    assert!(
        (2..=4).contains(&peak),
        "a pool of 3 and a listener, saw {peak}"
    );
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

/// The server is full: with a pool of their own and a separate listener
/// (a listen URL), waiters fall back to polling and the separate listener tries to connect
/// only a few times (backing off), not in a loop; once a connection is free
/// again, a waiter gets the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_backs_off_while_the_server_is_full() {
    let Some((cluster, url, _holder)) =
        small_cluster_with_a_holder(Duration::from_millis(2500)).await
    else {
        return;
    };
    // A pool of one and a listen URL: the listener is then a connection
    // apart (with the shared connection there is nothing more to refuse
    // once it is open; see
    // `a_refused_shared_connection_is_retried_at_most_once_a_second`).
    let options = PostgresOptions::new().with_listen_url(&url);
    let waiter = Locks::new(PostgresBackend::connect_with(&url, options).await.unwrap());
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

/// The server is full and the shared connection is closed (idle): a burst
/// of operations from four waiters fails fast with the server's reason, and
/// the process asks the server again at most once a second, not once per
/// operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_shared_connection_is_retried_at_most_once_a_second() {
    let Some((cluster, url, _holder)) = small_cluster_with_a_holder(Duration::from_secs(5)).await
    else {
        return;
    };
    let options = PostgresOptions::new().with_idle_timeout(Duration::from_millis(100));
    let waiter = Locks::new(PostgresBackend::connect_with(&url, options).await.unwrap());
    // Its connection closes once idle.
    sleep(Duration::from_millis(400)).await;
    let mut held = fill(&url).await;
    let refusals_before = cluster.log().matches("too many clients").count();

    let mut tasks = Vec::new();
    for i in 0..4 {
        let waiter = waiter.clone();
        // A key each: waiters of one key in a process take turns (local.rs).
        let key = format!("contended-{i}");
        tasks.push(tokio::spawn(async move {
            let options = AcquireOptions::new()
                .with_ttl(Duration::from_secs(1))
                .with_wait(Duration::from_millis(100));
            let until = Instant::now() + Duration::from_secs(2);
            let mut refused = 0;
            while Instant::now() < until {
                let started = Instant::now();
                match waiter.acquire_with(&key, &options).await {
                    Err(e @ Error::Unavailable { .. }) => {
                        assert!(e.to_string().contains("too many clients"), "{e}");
                        assert!(started.elapsed() < Duration::from_secs(2), "{e}");
                        refused += 1;
                        sleep(Duration::from_millis(20)).await;
                    }
                    other => panic!("expected a refusal while the server is full: {other:?}"),
                }
            }
            refused
        }));
    }
    let mut answered = 0;
    for t in tasks {
        answered += t.await.unwrap();
    }
    let refused = cluster.log().matches("too many clients").count() - refusals_before;
    eprintln!("{answered} operations refused; {refused} connection attempts refused in 2 s");
    assert!(answered >= 20, "only {answered} operations answered in 2 s");
    // The first attempt: the pool's own retries for 250 ms (sqlx: 10 ms
    // doubling, about 5), then one direct attempt; later attempts are one
    // each, a second apart. One per operation would make `answered`.
    assert!(
        (1..=10).contains(&refused),
        "the server was asked {refused} times in 2 s"
    );

    // Room again: the next operation after the last refusal's second
    // connects.
    held.truncate(held.len() - 2);
    sleep(Duration::from_millis(1100)).await;
    assert!(waiter.inspect("contended").await.unwrap().is_some());
}
