//! The shared connection (the default set-up: one connection per URL per
//! process carries the lock statements and `LISTEN`): it survives being
//! killed and black-holed, and a statement waiting for a row lock does not
//! hold up the renewals queued behind it. Against the real server in
//! `LEASEHOLD_TEST_POSTGRES` (skipped without it, unless
//! `LEASEHOLD_REQUIRE_SERVERS=1`).
#![cfg(all(feature = "conformance", feature = "postgres"))]

mod blackhole;

use std::time::Duration;

use leasehold::backend::{Acquire, AcquireRequest};
use leasehold::backends::postgres::{PostgresBackend, PostgresOptions};
use leasehold::conformance::server_url;
use leasehold::{AcquireOptions, Backend, Error, Key, Lease, Locks};
use sqlx::{Connection, PgConnection};
use tokio::time::{sleep, timeout, Instant};

fn unique(prefix: &str) -> String {
    format!("{prefix}_{:016x}", rand::random::<u64>())
}

/// `url` with `application_name` set, so its connection can be found.
fn tagged(url: &str, app: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}application_name={app}")
}

/// Another process's backend, as far as the shared connection goes: a pool
/// of its own.
async fn other_process(url: &str) -> PostgresBackend {
    let options = PostgresOptions::new().with_max_connections(2);
    PostgresBackend::connect_with(url, options).await.unwrap()
}

/// [`other_process`] holding `key`, and a transaction of its own that
/// row-locks the lease's record (`check_in`) until it ends.
async fn held_and_row_locked(
    url: &str,
    key: &str,
) -> (
    PostgresBackend,
    Lease,
    sqlx::Transaction<'static, sqlx::Postgres>,
) {
    let holder = other_process(url).await;
    let req = AcquireRequest::new(Key::new(key).unwrap(), Duration::from_secs(30), "h").unwrap();
    let Acquire::Granted(lease) = holder.try_acquire(&req).await.unwrap() else {
        panic!("{key} is free");
    };
    let mut tx = holder.pool().begin().await.unwrap();
    holder.check_in(&mut tx, &lease).await.unwrap();
    (holder, lease, tx)
}

async fn pids_of(probe: &mut PgConnection, app: &str) -> Vec<i32> {
    sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE application_name = $1")
        .bind(app)
        .fetch_all(probe)
        .await
        .unwrap()
}

/// The connection is killed while a waiter waits, and the release comes
/// while it is down: the waiter is woken once `LISTEN` is back (well
/// before its polling backoff would find the key), and the process is
/// back to one connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_connection_comes_back_and_wakes_its_waiters() {
    let Some(base) = server_url("LEASEHOLD_TEST_POSTGRES") else {
        return;
    };
    let app = unique("shared_kill");
    let locks = Locks::open(&tagged(&base, &app)).await.unwrap();
    let mut probe = PgConnection::connect(&base).await.unwrap();
    let holder = other_process(&base).await;
    let key = unique("shared-kill-key");
    let req = AcquireRequest::new(Key::new(&key).unwrap(), Duration::from_secs(30), "h").unwrap();
    let Acquire::Granted(lease) = holder.try_acquire(&req).await.unwrap() else {
        panic!("{key} is free");
    };
    let waiter = tokio::spawn({
        let (locks, key) = (locks.clone(), key.clone());
        async move {
            let options = AcquireOptions::new().with_wait(Duration::from_secs(20));
            locks.acquire_with(&key, &options).await
        }
    });
    // Long enough for the waiter's polling backoff to grow past a second.
    sleep(Duration::from_secs(3)).await;
    let pids = pids_of(&mut probe, &app).await;
    assert_eq!(pids.len(), 1, "one connection: {pids:?}");
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pids[0])
        .fetch_one(&mut probe)
        .await
        .unwrap();
    assert!(killed);
    holder.release(&lease).await.unwrap();
    let released = Instant::now();
    let guard = timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter gets the key")
        .unwrap()
        .unwrap();
    let took = released.elapsed();
    eprintln!("woken {took:?} after the release");
    // Reconnecting takes a backoff of 50-100 ms; polling alone would take
    // 1-2 s at this point of the wait.
    assert!(took < Duration::from_millis(900), "took {took:?}");
    let now = pids_of(&mut probe, &app).await;
    assert_eq!(now.len(), 1, "one connection again: {now:?}");
    assert_ne!(now[0], pids[0]);
    guard.release().await.unwrap();
}

/// The shared connection goes dead without closing: the renewal stuck on it
/// gives up after its attempt bound, that marks the connection dead, and
/// the retry goes out on a new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_shared_connection_does_not_lose_the_lease() {
    let Some(url) = server_url("LEASEHOLD_TEST_POSTGRES") else {
        return;
    };
    let (proxy, direct) = blackhole::in_front_of_postgres(&url).await;
    let proxied = format!(
        "postgres://{}@127.0.0.1:{}/{}",
        direct.get_username(),
        proxy.addr().port(),
        direct.get_database().unwrap_or("postgres")
    );
    let locks = Locks::open(&proxied).await.unwrap();
    let key = unique("shared-renewed");
    let checker = other_process(&url).await;
    blackhole::renewals_outlive_frozen_connections(&locks, &proxy, &key, &checker).await;
}

/// Another transaction keeps a lease row locked (the holder's `check_in`)
/// while this process waits for that key: the waiter's statements wait
/// for the row lock 50 ms at most, so the renewals of a short lease of the
/// same process, queued behind them on the one connection, keep it alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_lock_wait_does_not_hold_up_renewals() {
    let Some(url) = server_url("LEASEHOLD_TEST_POSTGRES") else {
        return;
    };
    let blocked = unique("shared-row-locked");
    let (holder, lease, tx) = held_and_row_locked(&url, &blocked).await;

    let locks = Locks::open(&url).await.unwrap();
    // Renewal every 200 ms, each attempt bounded by 100 ms.
    let short = locks
        .acquire_with(
            &unique("shared-short"),
            &AcquireOptions::new().with_ttl(Duration::from_millis(600)),
        )
        .await
        .unwrap();
    let wait = Duration::from_millis(2500);
    let started = Instant::now();
    let outcome = locks
        .acquire_with(&blocked, &AcquireOptions::new().with_wait(wait))
        .await;
    let took = started.elapsed();
    assert!(matches!(outcome, Err(Error::Timeout { .. })), "{outcome:?}");
    assert!(took < wait + Duration::from_millis(700), "took {took:?}");
    assert!(
        !short.is_lost(),
        "a renewal queued behind a row-lock wait missed its bound"
    );
    short.release().await.unwrap();
    tx.rollback().await.unwrap();
    holder.release(&lease).await.unwrap();
}

/// Every runtime of a process shares the URL's connection, and none of
/// them outlives the others (`cargo test` runs a runtime per test, in
/// parallel): a statement sent from one runtime survives the end of the
/// runtime that opened the connection. It waits at the server for a row
/// lock while that runtime shuts down.
#[test]
fn the_shared_connection_outlives_the_runtime_that_opened_it() {
    let Some(url) = server_url("LEASEHOLD_TEST_POSTGRES") else {
        return;
    };
    let opening = tokio::runtime::Runtime::new().unwrap();
    let other = tokio::runtime::Runtime::new().unwrap();
    let key = unique("shared-runtimes");
    // The first runtime to use the URL in this test process: it opens the
    // shared connection (no other test of this file shares the process
    // under nextest; under libtest the race only makes it pass more often).
    let opener = opening.block_on(async {
        let locks = Locks::open(&url).await.unwrap();
        locks.inspect(&key).await.unwrap();
        locks
    });
    // Another process holds the key, and a transaction of its row-locks the
    // lease's record, so the force-release below waits at the server.
    let (holder, lease, tx) = other.block_on(held_and_row_locked(&url, &key));
    let locks = other.block_on(Locks::open(&url)).unwrap();
    let breaking = {
        let key = key.clone();
        other.spawn(async move { locks.force_release(&key).await })
    };
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !breaking.is_finished(),
        "the force-release waits for the row lock"
    );
    drop(opening);
    other.block_on(tx.rollback()).unwrap();
    let outcome = other.block_on(breaking).unwrap();
    assert!(
        matches!(outcome, Ok(true)),
        "the force-release was lost with the runtime that opened the connection: {outcome:?}"
    );
    other.block_on(async {
        holder.release(&lease).await.unwrap();
        drop(opener);
    });
}

/// A TCP proxy that holds back every reply by a fixed delay (a server far
/// away), without slowing the stream down, and counts the connections it
/// carries.
struct SlowReplies {
    addr: std::net::SocketAddr,
    connections: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    accept: tokio::task::JoinHandle<()>,
}

impl SlowReplies {
    async fn start(upstream: std::net::SocketAddr, delay: Duration) -> Self {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = std::sync::Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let requests = tokio::io::copy(&mut cr, &mut sw);
                    // Replies: read as they come, each chunk written `delay`
                    // after it arrived.
                    let (chunks, mut due) = tokio::sync::mpsc::unbounded_channel();
                    let read = async move {
                        let mut buf = vec![0u8; 16 * 1024];
                        while let Ok(n @ 1..) = sr.read(&mut buf).await {
                            if chunks
                                .send((Instant::now() + delay, buf[..n].to_vec()))
                                .is_err()
                            {
                                break;
                            }
                        }
                    };
                    let write = async move {
                        while let Some((at, chunk)) = due.recv().await {
                            tokio::time::sleep_until(at).await;
                            if cw.write_all(&chunk).await.is_err() {
                                break;
                            }
                        }
                    };
                    tokio::select! {
                        _ = requests => {}
                        _ = async { tokio::join!(read, write) } => {}
                    }
                });
            }
        });
        SlowReplies {
            addr,
            connections,
            accept,
        }
    }

    fn connections(&self) -> usize {
        self.connections.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for SlowReplies {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Replies come 120 ms late, and other tasks of the process keep giving up
/// on their statements after 5 ms: only a caller's own statement may be
/// abandoned, and not while the slow link is still within its normal time,
/// so the connection is never reopened and a guard's renewals (queued
/// behind those statements) keep its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_that_give_up_on_a_slow_link_abandon_no_statement() {
    let Some(url) = server_url("LEASEHOLD_TEST_POSTGRES") else {
        return;
    };
    let (_, direct) = blackhole::in_front_of_postgres(&url).await;
    let upstream = {
        use std::net::ToSocketAddrs;
        (direct.get_host(), direct.get_port())
            .to_socket_addrs()
            .unwrap()
            .next()
            .unwrap()
    };
    let proxy = SlowReplies::start(upstream, Duration::from_millis(120)).await;
    let proxied = format!(
        "postgres://{}@127.0.0.1:{}/{}",
        direct.get_username(),
        proxy.addr.port(),
        direct.get_database().unwrap_or("postgres")
    );
    let locks = Locks::open(&proxied).await.unwrap();
    let key = unique("slow-link-held");
    let ttl = Duration::from_secs(3);
    let guard = locks
        .acquire_with(&key, &AcquireOptions::new().with_ttl(ttl))
        .await
        .unwrap();
    assert_eq!(proxy.connections(), 1, "one connection to begin with");

    let until = Instant::now() + ttl * 3;
    let mut impatient = Vec::new();
    for _ in 0..4 {
        let locks = locks.clone();
        impatient.push(tokio::spawn(async move {
            let mut gave_up = 0u32;
            while Instant::now() < until {
                let other = unique("slow-link-other");
                match timeout(Duration::from_millis(5), locks.try_acquire(&other)).await {
                    Err(_) => gave_up += 1,
                    Ok(Ok(guard)) => drop(guard),
                    Ok(Err(e)) => panic!("{e}"),
                }
            }
            gave_up
        }));
    }
    let mut gave_up = 0;
    for task in impatient {
        gave_up += task.await.unwrap();
    }
    eprintln!(
        "callers gave up {gave_up} times; {} connection(s); lost: {}",
        proxy.connections(),
        guard.is_lost()
    );
    assert!(gave_up > 100, "callers gave up {gave_up} times");
    assert!(!guard.is_lost(), "the guard was lost");
    assert_eq!(
        proxy.connections(),
        1,
        "the connection was reopened while every statement was answered"
    );
    let checker = other_process(&url).await;
    let held = checker
        .inspect(&Key::new(&key).unwrap())
        .await
        .unwrap()
        .expect("still held at the store");
    assert_eq!(held.token, guard.token());
    guard.release().await.unwrap();
}
