//! PostgreSQL's release notifications: the `LISTEN` connection comes back
//! after it is killed or cut off, wakes waiters once it is back (and not
//! before), and a stalled one does not stretch a wait. Against the real
//! server in `LEASEHOLD_TEST_POSTGRES` (skipped without it, unless
//! `LEASEHOLD_REQUIRE_SERVERS=1`).
#![cfg(all(feature = "conformance", feature = "postgres"))]

#[path = "support/common.rs"]
mod common;
#[path = "support/postgres.rs"]
mod postgres;

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{grant, unique};
use leasehold::backends::postgres::{PostgresBackend, PostgresOptions};
use leasehold::{Backend, Error, Key, Locks};
use postgres::{pool, url};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use tokio::time::{sleep, timeout, Instant};

/// The pid of the LISTEN connection whose application_name is `app`.
async fn listener_pid(admin: &PgPool, app: &str) -> Option<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN%'",
    )
    .bind(app)
    .fetch_optional(admin)
    .await
    .unwrap()
}

#[tokio::test]
async fn listener_reconnects_after_its_connection_is_killed() {
    let Some(url) = url() else { return };
    let admin = pool(&url).await;
    let app = unique("leasehold_listen_test");
    let options = PgConnectOptions::from_str(&url)
        .unwrap()
        .application_name(&app);
    let waiter_pool = PgPoolOptions::new().connect_with(options).await.unwrap();
    let waiter = PostgresBackend::from_pool(waiter_pool, PostgresOptions::new())
        .await
        .unwrap();
    let releaser = PostgresBackend::connect(&url).await.unwrap();
    let key = Key::new(unique("reconnect")).unwrap();

    let first = waiter.subscribe(&key).await.unwrap();
    let old_pid = listener_pid(&admin, &app).await.expect("LISTEN connection");
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(old_pid)
        .fetch_one(&admin)
        .await
        .unwrap();
    assert!(killed);
    drop(first);

    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match listener_pid(&admin, &app).await {
            Some(pid) if pid != old_pid => break,
            _ if Instant::now() > deadline => panic!("LISTEN connection not re-established"),
            _ => sleep(Duration::from_millis(50)).await,
        }
    }
    // Subscribed after the reconnect, so only a real NOTIFY can wake it.
    let lease = grant(&releaser, key.as_str(), Duration::from_secs(60)).await;
    let mut sub = waiter.subscribe(&key).await.unwrap();
    releaser.release(&lease).await.unwrap();
    timeout(Duration::from_secs(5), sub.notified())
        .await
        .expect("woken through the re-established LISTEN connection");
}

/// A LISTEN connection that cannot be made (here: a server that accepts
/// the connection and never answers, as a hung pooler does) must not hold
/// waiters past their bound: before, the first waiter blocked in
/// `subscribe` on the connection attempt, and every other waiter queued
/// behind it on a mutex.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_listen_connection_does_not_stretch_the_wait() {
    let Some(url) = url() else { return };
    let black_hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let listen_url = format!(
        "postgres://postgres@{}/test",
        black_hole.local_addr().unwrap()
    );
    let holder = PostgresBackend::connect(&url).await.unwrap();
    let waiter = Locks::new(
        PostgresBackend::connect_with(&url, PostgresOptions::new().with_listen_url(&listen_url))
            .await
            .unwrap(),
    );
    let key = unique("stalled_listen");
    let lease = grant(&holder, &key, Duration::from_secs(30)).await;

    let wait = Duration::from_millis(300);
    // Honest slack for a loaded machine; before, this took the pool's
    // connect timeout (seconds) per waiter, one after the other.
    let bound = wait + Duration::from_millis(700);
    let started = Instant::now();
    let waits = (0..2).map(|_| {
        let (waiter, key) = (waiter.clone(), key.clone());
        async move {
            let e = timeout(Duration::from_secs(10), waiter.acquire(&key, wait))
                .await
                .expect("the wait ends")
                .unwrap_err();
            (e, started.elapsed())
        }
    });
    let handles: Vec<_> = waits.map(tokio::spawn).collect();
    for h in handles {
        let (e, took) = h.await.unwrap();
        assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
        assert!(took < bound, "a {wait:?} wait took {took:?}");
    }
    holder.release(&lease).await.unwrap();
    drop(black_hole);
}

/// A TCP proxy in front of the server whose connections the test can cut,
/// and which then refuses new ones until resumed: a network outage.
struct Proxy {
    addr: std::net::SocketAddr,
    refusing: Arc<AtomicBool>,
    links: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(target: String) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let refusing = Arc::new(AtomicBool::new(false));
        let links = Arc::new(Mutex::new(Vec::new()));
        let accept = tokio::spawn({
            let (refusing, links) = (refusing.clone(), links.clone());
            async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    if refusing.load(Ordering::SeqCst) {
                        continue; // dropped: the client sees the connection close
                    }
                    let target = target.clone();
                    let link = tokio::spawn(async move {
                        if let Ok(mut out) = tokio::net::TcpStream::connect(target).await {
                            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                        }
                    });
                    links.lock().unwrap().push(link);
                }
            }
        });
        Proxy {
            addr,
            refusing,
            links,
            accept,
        }
    }

    /// Closes every connection and refuses new ones.
    fn cut(&self) {
        self.refusing.store(true, Ordering::SeqCst);
        for link in self.links.lock().unwrap().drain(..) {
            link.abort();
        }
    }

    fn resume(&self) {
        self.refusing.store(false, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

/// Waiters are woken when LISTEN is back after an outage, not before: a
/// waiter woken earlier retries, finds the key still held, and then misses
/// the release that follows while nobody listens. Before, every failed
/// reconnect woke all waiters, and the successful one (inside sqlx) woke
/// nobody, so a release during the outage was never heard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_woken_once_listen_is_back_and_not_before() {
    let Some(url) = url() else { return };
    let server = PgConnectOptions::from_str(&url).unwrap();
    let target = format!("{}:{}", server.get_host(), server.get_port());
    let proxy = Proxy::start(target.clone()).await;
    let listen_url = url.replacen(&target, &proxy.addr.to_string(), 1);
    assert_ne!(listen_url, url, "the listen URL goes through the proxy");
    let waiter =
        PostgresBackend::connect_with(&url, PostgresOptions::new().with_listen_url(&listen_url))
            .await
            .unwrap();
    let releaser = PostgresBackend::connect(&url).await.unwrap();
    let key = Key::new(unique("relisten")).unwrap();
    let lease = grant(&releaser, key.as_str(), Duration::from_secs(60)).await;
    let mut sub = waiter.subscribe(&key).await.unwrap();
    assert!(sub.is_live());

    proxy.cut();
    // Announced while nobody listens: lost.
    releaser.release(&lease).await.unwrap();
    assert!(
        timeout(Duration::from_secs(1), sub.notified())
            .await
            .is_err(),
        "woken while LISTEN was down: the waiter would retry too early"
    );
    proxy.resume();
    timeout(Duration::from_secs(10), sub.notified())
        .await
        .expect("woken once LISTEN is back, to find the key released");
}
