//! Redis fixtures: the shared test server with a key prefix of one test,
//! raw connections, and a private `redis-server` for tests that kill or
//! restart it.
#![allow(dead_code)] // each test crate uses its own subset

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use leasehold::backend::{Acquire, AcquireRequest};
use leasehold::backends::redis::{RedisBackend, RedisOptions};
use leasehold::conformance::{server_url, TestStore};
use leasehold::{Backend, Key, Lease};
use redis::aio::MultiplexedConnection;

pub fn random_prefix() -> String {
    format!("leasehold-test-{:016x}", rand::random::<u64>())
}

/// A backend on the shared server under `prefix`, and a raw connection.
pub async fn shared(prefix: &str) -> Option<(RedisBackend, MultiplexedConnection)> {
    let url = server_url("LEASEHOLD_TEST_REDIS")?;
    let backend = RedisBackend::connect_with(&url, RedisOptions::new().with_prefix(prefix))
        .await
        .expect("connect to LEASEHOLD_TEST_REDIS");
    Some((backend, raw(&url).await))
}

/// The conformance suite's store on the server of `url_var` (a `scheme://`
/// URL: `redis` or `redis+cluster`) with `options` and a fresh prefix: two
/// clients, bad options, and a closed port in the same scheme.
pub async fn conformance_store(
    url_var: &str,
    scheme: &'static str,
    options: RedisOptions,
) -> Option<TestStore> {
    let url = server_url(url_var)?;
    let options = options.with_prefix(random_prefix());
    let connect = || async {
        let backend = RedisBackend::connect_with(&url, options.clone())
            .await
            .unwrap_or_else(|e| panic!("connect to {url_var}: {e}"));
        std::sync::Arc::new(backend)
    };
    let down = format!("{scheme}://127.0.0.1:{}", free_port());
    let bad = move |what, options: RedisOptions| {
        let down = down.clone();
        (what, move || {
            let (down, options) = (down.clone(), options.clone());
            async move { RedisBackend::connect_with(&down, options).await }
        })
    };
    let mut store = TestStore::new(connect().await)
        .with_second_client(connect().await)
        .with_url_at_port(move |port| format!("{scheme}://127.0.0.1:{port}"));
    for (what, open) in [
        bad("redis key prefix", RedisOptions::new().with_prefix("")),
        bad("redis key prefix", RedisOptions::new().with_prefix("a{b}")),
        bad(
            "redis connect timeout",
            RedisOptions::new().with_connect_timeout(Duration::ZERO),
        ),
    ] {
        store = store.with_bad_option(what, open);
    }
    Some(store)
}

pub async fn raw(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection")
}

pub fn key(k: &str) -> Key {
    Key::new(k).unwrap()
}

pub async fn grant(backend: &RedisBackend, k: &Key, ttl: Duration) -> Lease {
    let req = AcquireRequest::new(k.clone(), ttl, "redis-test").unwrap();
    match backend.try_acquire(&req).await.expect("store answers") {
        Acquire::Granted(lease) => lease,
        b => panic!("{k:?} is not granted: {b:?}"),
    }
}

pub async fn exists(conn: &mut MultiplexedConnection, name: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(name)
        .query_async::<i64>(conn)
        .await
        .unwrap()
        == 1
}

pub async fn pubsub_client_ids(conn: &mut MultiplexedConnection) -> Vec<String> {
    let list: String = redis::cmd("CLIENT")
        .arg(&["LIST", "TYPE", "pubsub"])
        .query_async(conn)
        .await
        .unwrap();
    list.lines()
        .filter_map(|l| l.split(' ').find(|f| f.starts_with("id=")))
        .map(str::to_owned)
        .collect()
}

/// Kills every pub/sub connection on the server; the test's server must
/// be its own.
pub async fn kill_pubsub_clients(conn: &mut MultiplexedConnection) -> i64 {
    redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "pubsub"])
        .query_async(conn)
        .await
        .unwrap()
}

pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A `redis-server` child process of this test, killed when dropped, so a
/// failing test does not leave it behind.
pub struct PrivateRedis {
    child: Option<Child>,
    port: u16,
}

impl PrivateRedis {
    /// Starts a server on `port` with its data in `dir`; `None` (skip) if
    /// `redis-server` is not installed, unless servers are required.
    pub fn start(dir: &Path, port: u16, extra: &[&str]) -> Option<Self> {
        let spawned = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--daemonize", "no", "--dir"])
            .arg(dir)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match spawned {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if std::env::var("LEASEHOLD_REQUIRE_SERVERS").as_deref() == Ok("1") {
                    panic!("redis-server is not installed and LEASEHOLD_REQUIRE_SERVERS=1");
                }
                eprintln!("skipping: redis-server is not installed");
                return None;
            }
            Err(e) => panic!("cannot start redis-server: {e}"),
        };
        let server = PrivateRedis {
            child: Some(child),
            port,
        };
        server.wait_ready();
        Some(server)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Answers PING with PONG (not LOADING) within 10 s, or panics.
    fn wait_ready(&self) {
        let client = redis::Client::open(self.url()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let pong = client
                .get_connection_with_timeout(Duration::from_secs(1))
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
            if pong.is_ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server not ready: {pong:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// kill -9, and reap it so the port and files are free.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.kill();
    }
}
