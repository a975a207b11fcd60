//! Redis-specific properties beyond the shared suite: the key namespace on a
//! real server, expiry without resurrection, error classification, pub/sub
//! reconnection and fence durability across a server restart.
//!
//! Tests on the shared server read `LEASEHOLD_TEST_REDIS`; tests that kill
//! or restart a server start a private `redis-server` of their own.
#![cfg(all(feature = "conformance", feature = "redis"))]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use leasehold::backend::{Acquire, AcquireRequest};
use leasehold::backends::redis::{RedisBackend, RedisOptions};
use leasehold::conformance::server_url;
use leasehold::{Backend, Error, Key, Lease, Locks};
use redis::aio::MultiplexedConnection;

fn random_prefix() -> String {
    format!("leasehold-test-{:016x}", rand::random::<u64>())
}

async fn shared(prefix: &str) -> Option<(RedisBackend, MultiplexedConnection)> {
    let url = server_url("LEASEHOLD_TEST_REDIS")?;
    let backend = RedisBackend::connect_with(&url, RedisOptions::new().with_prefix(prefix))
        .await
        .expect("connect to LEASEHOLD_TEST_REDIS");
    Some((backend, raw(&url).await))
}

async fn raw(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection")
}

fn key(k: &str) -> Key {
    Key::new(k).unwrap()
}

async fn grant(backend: &RedisBackend, k: &Key, ttl: Duration) -> Lease {
    let req = AcquireRequest::new(k.clone(), ttl, "redis-test").unwrap();
    match backend.try_acquire(&req).await.expect("store answers") {
        Acquire::Granted(lease) => lease,
        Acquire::Busy(b) => panic!("{k:?} is held: {b:?}"),
    }
}

async fn exists(conn: &mut MultiplexedConnection, name: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(name)
        .query_async::<i64>(conn)
        .await
        .unwrap()
        == 1
}

#[tokio::test]
async fn prefix_and_key_never_collide_on_the_server() {
    let base = random_prefix();
    let Some((a, _)) = shared(&format!("{base}a:")).await else {
        return;
    };
    let (b, _) = shared(&format!("{base}a:b")).await.unwrap();
    let la = grant(&a, &key("b:c"), Duration::from_secs(30)).await;
    // Same concatenated text, different (prefix, key): must be a free lock.
    let lb = grant(&b, &key(":c"), Duration::from_secs(30)).await;
    assert_ne!(a.lock_key(la.key()), b.lock_key(lb.key()));
    assert_eq!(a.list("").await.unwrap().len(), 1);
    assert_eq!(b.list("").await.unwrap().len(), 1);
}

#[tokio::test]
async fn list_treats_pattern_characters_literally() {
    let Some((backend, _)) = shared(&random_prefix()).await else {
        return;
    };
    let keys = ["[ab]", "a", "b", "?x", "{t}", "{t}x", "}", "\\", "%7B", "{"];
    for k in keys {
        grant(&backend, &key(k), Duration::from_secs(30)).await;
    }
    for prefix in ["[ab]", "[", "?", "{t}", "{", "}", "\\", "%", "", "z"] {
        let listed: Vec<String> = backend
            .list(prefix)
            .await
            .unwrap()
            .into_iter()
            .map(|i| i.key.to_string())
            .collect();
        let mut expected: Vec<String> = keys
            .iter()
            .filter(|k| k.starts_with(prefix))
            .map(|k| k.to_string())
            .collect();
        expected.sort();
        assert_eq!(listed, expected, "prefix {prefix:?}");
    }
}

#[tokio::test]
async fn renew_never_resurrects_and_refuses_a_zero_ttl() {
    let Some((backend, mut conn)) = shared(&random_prefix()).await else {
        return;
    };
    let k = key("k");
    let live = grant(&backend, &k, Duration::from_secs(30)).await;
    // The core only renews with a lease's own ttl, checked when the lease
    // was asked for; a caller of the backend itself that passes 0 is
    // refused by the script (PEXPIRE with 0 or a negative ttl would delete
    // the key), as is any ttl it is sent.
    match backend.renew(&live, Duration::ZERO).await {
        Err(e @ Error::Backend { .. }) => assert!(e.to_string().contains("ttl must be positive")),
        other => panic!("renew with ttl 0 must be refused, got {other:?}"),
    }
    let renew_lua = redis::Script::new(include_str!("../src/backends/redis/renew.lua"));
    for ttl in ["0", "-5"] {
        let refused = renew_lua
            .key(backend.lock_key(&k))
            .key(backend.fence_key(&k))
            .arg(live.owner().to_string())
            .arg(live.token())
            .arg(ttl)
            .invoke_async::<i64>(&mut conn)
            .await;
        assert!(refused.is_err(), "ttl {ttl}: {refused:?}");
    }
    assert!(exists(&mut conn, &backend.lock_key(&k)).await, "lock kept");
    backend.release(&live).await.unwrap();

    let short = grant(&backend, &k, Duration::from_millis(100)).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!backend
        .renew(&short, Duration::from_secs(30))
        .await
        .unwrap());
    assert!(
        !exists(&mut conn, &backend.lock_key(&k)).await,
        "expired lock key must stay gone"
    );
    assert!(
        exists(&mut conn, &backend.fence_key(&k)).await,
        "the fence outlives the lease"
    );
}

#[tokio::test]
async fn fence_key_equals_the_live_token() {
    let Some((backend, mut conn)) = shared(&random_prefix()).await else {
        return;
    };
    let k = key("orders:{42}");
    let first = grant(&backend, &k, Duration::from_secs(30)).await;
    backend.release(&first).await.unwrap();
    let lease = grant(&backend, &k, Duration::from_secs(30)).await;
    let fence: u64 = redis::cmd("GET")
        .arg(backend.fence_key(&k))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(fence, lease.token());
    assert!(lease.token() > first.token());
}

/// The lease-checked write shown in docs/redis.md: accepted only while the
/// writer's lease is live at the server.
const FENCED_WRITE: &str = r#"
local holder = redis.call('GET', KEYS[1])
if not holder or string.sub(holder, 1, 32) ~= ARGV[1]
    or redis.call('GET', KEYS[2]) ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[3], 'stock', ARGV[3], 'fence', ARGV[2])
return 1
"#;

#[tokio::test]
async fn documented_fenced_write_rejects_stale_holders() {
    let Some((backend, mut conn)) = shared(&random_prefix()).await else {
        return;
    };
    let k = key("sku:42");
    let data = format!("{}:inventory:{{sku:42}}", random_prefix());
    let script = redis::Script::new(FENCED_WRITE);
    let write = |lease: &Lease, stock: i64| {
        let mut call = script.prepare_invoke();
        call.key(backend.lock_key(&k))
            .key(backend.fence_key(&k))
            .key(&data)
            .arg(lease.owner().to_string())
            .arg(lease.token())
            .arg(stock);
        let mut conn = conn.clone();
        async move { call.invoke_async::<i64>(&mut conn).await.unwrap() }
    };
    let old = grant(&backend, &k, Duration::from_secs(30)).await;
    assert_eq!(write(&old, 10).await, 1, "the holder writes");
    backend.force_release(&k).await.unwrap();
    assert_eq!(write(&old, 9).await, 0, "an evicted holder cannot write");
    let new = grant(&backend, &k, Duration::from_millis(100)).await;
    assert_eq!(write(&old, 8).await, 0, "nor once a newer holder exists");
    assert_eq!(write(&new, 7).await, 1);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(write(&new, 6).await, 0, "nor after its lease expired");
    let stock: i64 = redis::cmd("HGET")
        .arg(&data)
        .arg("stock")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(stock, 7);
    let _: () = redis::cmd("DEL")
        .arg(&data)
        .query_async(&mut conn)
        .await
        .unwrap();
}

#[tokio::test]
async fn from_manager_uses_the_callers_connection() {
    let Some(url) = server_url("LEASEHOLD_TEST_REDIS") else {
        return;
    };
    let client = redis::Client::open(url.as_str()).unwrap();
    let manager = redis::aio::ConnectionManager::new(client.clone())
        .await
        .unwrap();
    let backend = RedisBackend::from_manager_with(
        manager,
        client,
        RedisOptions::new().with_prefix(random_prefix()),
    )
    .await
    .unwrap();
    let locks = Locks::new(backend);
    let guard = locks.try_acquire("k").await.unwrap();
    assert!(matches!(
        locks.try_acquire("k").await,
        Err(Error::Busy { .. })
    ));
    guard.release().await.unwrap();
}

#[tokio::test]
async fn bad_options_fail_before_any_io() {
    // Nothing listens there: checking the options after connecting would
    // fail with Unavailable instead.
    let url = &format!("redis://127.0.0.1:{}", free_port());
    for (options, what) in [
        (RedisOptions::new().with_prefix(""), "redis key prefix"),
        (RedisOptions::new().with_prefix("a{b}"), "redis key prefix"),
        (
            RedisOptions::new().with_connect_timeout(Duration::ZERO),
            "redis connect timeout",
        ),
    ] {
        match RedisBackend::connect_with(url, options).await {
            Err(Error::InvalidInput { what: w, .. }) => assert_eq!(w, what),
            other => panic!("expected InvalidInput({what}), got {other:?}"),
        }
    }
}

#[tokio::test]
async fn closed_port_is_unavailable_within_seconds() {
    let port = free_port();
    let started = Instant::now();
    match RedisBackend::connect(&format!("redis://127.0.0.1:{port}")).await {
        Err(e @ Error::Unavailable { .. }) => assert!(e.is_retryable()),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    // The CLI promises exit 69 within 10 s; connecting is most of that.
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriber_resubscribes_after_its_connection_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let Some(server) = PrivateRedis::start(dir.path(), free_port(), &[]) else {
        return;
    };
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let mut conn = raw(&server.url()).await;
    let k = key("k");
    let lease = grant(&backend, &k, Duration::from_secs(60)).await;
    let mut sub = backend.subscribe(&k).await.unwrap();
    assert!(sub.is_live());

    let before = pubsub_client_ids(&mut conn).await;
    assert_eq!(before.len(), 1, "one subscriber connection per backend");
    // This server is ours alone, so killing every pub/sub client is safe.
    let killed: i64 = redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "pubsub"])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(killed, 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = pubsub_client_ids(&mut conn).await;
        if now.len() == 1 && now != before {
            break;
        }
        assert!(Instant::now() < deadline, "subscriber did not come back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    backend.release(&lease).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), sub.notified())
        .await
        .expect("a release after the reconnect wakes the waiter");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_survives_a_restart_with_aof() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let aof = ["--appendonly", "yes", "--appendfsync", "always"];
    let Some(mut server) = PrivateRedis::start(dir.path(), port, &aof) else {
        return;
    };
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let k = key("k");
    let first = grant(&backend, &k, Duration::from_secs(30)).await;
    backend.release(&first).await.unwrap();
    let held = grant(&backend, &k, Duration::from_millis(500)).await;
    assert!(held.token() > first.token());

    server.kill();
    match backend.inspect(&k).await {
        Err(e @ Error::Unavailable { .. }) => assert!(e.is_retryable()),
        other => panic!("a dead server must be Unavailable, got {other:?}"),
    }
    drop(backend);
    let server = PrivateRedis::start(dir.path(), port, &aof).expect("restart");

    let locks = Locks::open(&server.url()).await.unwrap();
    // The held lease was restored with its expiry; wait it out.
    let after = locks.acquire("k", Duration::from_secs(10)).await.unwrap();
    assert!(
        after.token() > held.token(),
        "token went backwards across a restart: {} after {}",
        after.token(),
        held.token()
    );
    after.release().await.unwrap();
}

/// A Redis ACL user on the shared server, made for one test and deleted
/// when dropped (even if the test fails).
struct AclUser {
    admin_url: String,
    name: String,
    password: String,
}

impl AclUser {
    /// Creates a user with every command and key but the given channel rule
    /// (`resetchannels`: no pub/sub at all; `allchannels`: everything).
    async fn create(admin_url: &str, channels: &str) -> Self {
        let user = AclUser {
            admin_url: admin_url.to_owned(),
            name: format!("leasehold-test-{:016x}", rand::random::<u64>()),
            password: format!("{:016x}", rand::random::<u64>()),
        };
        let mut conn = raw(admin_url).await;
        redis::cmd("ACL")
            .arg("SETUSER")
            .arg(&user.name)
            .arg("on")
            .arg(format!(">{}", user.password))
            .arg("~*")
            .arg(channels)
            .arg("+@all")
            .query_async::<()>(&mut conn)
            .await
            .expect("ACL SETUSER");
        user
    }

    /// The shared server's URL, logged in as this user.
    fn url(&self) -> String {
        let rest = self
            .admin_url
            .strip_prefix("redis://")
            .expect("a redis:// URL");
        let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
        format!("redis://{}:{}@{rest}", self.name, self.password)
    }
}

impl Drop for AclUser {
    fn drop(&mut self) {
        // ACL DELUSER also disconnects the user's clients.
        let deleted = redis::Client::open(self.admin_url.as_str())
            .and_then(|c| c.get_connection())
            .and_then(|mut c| {
                redis::cmd("ACL")
                    .arg("DELUSER")
                    .arg(&self.name)
                    .query::<i64>(&mut c)
            });
        if let Err(e) = deleted {
            eprintln!("could not delete ACL user {}: {e}", self.name);
        }
    }
}

/// A waiter whose user may not subscribe polls from the start: its wait
/// ends within its bound (it took 4 s, two connect timeouts, before), and a
/// release is still found by polling within the bound.
#[tokio::test]
async fn a_user_without_pubsub_rights_waits_within_its_bound() {
    let Some(url) = server_url("LEASEHOLD_TEST_REDIS") else {
        return;
    };
    let user = AclUser::create(&url, "resetchannels").await;
    let prefix = random_prefix();
    let holder = RedisBackend::connect_with(&url, RedisOptions::new().with_prefix(&prefix))
        .await
        .unwrap();
    let waiter = Locks::new(
        RedisBackend::connect_with(&user.url(), RedisOptions::new().with_prefix(&prefix))
            .await
            .expect("the restricted user may run commands"),
    );
    let k = key("k");
    let lease = grant(&holder, &k, Duration::from_secs(30)).await;
    // Slack for a loaded machine; the old code took 4 s here.
    let slack = Duration::from_millis(700);

    let wait = Duration::from_millis(500);
    let started = Instant::now();
    let e = waiter.acquire("k", wait).await.unwrap_err();
    let took = started.elapsed();
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
    assert!(took < wait + slack, "a 500ms wait took {took:?}");

    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        holder.release(&lease).await.unwrap();
    });
    let wait = Duration::from_secs(2);
    let started = Instant::now();
    let guard = waiter
        .acquire("k", wait)
        .await
        .expect("the release is found by polling");
    let took = started.elapsed();
    assert!(took < wait, "acquired only after {took:?}, past the bound");
    release.await.unwrap();
    guard.release().await.unwrap();
}

/// Releases published while the subscriber was reconnecting were never
/// heard: the subscriber wakes every waiter once it is subscribed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resubscribing_wakes_waiters_that_missed_a_release() {
    let dir = tempfile::tempdir().unwrap();
    let Some(server) = PrivateRedis::start(dir.path(), free_port(), &[]) else {
        return;
    };
    let waiter = RedisBackend::connect(&server.url()).await.unwrap();
    let releaser = RedisBackend::connect(&server.url()).await.unwrap();
    let mut conn = raw(&server.url()).await;
    let k = key("k");
    let lease = grant(&releaser, &k, Duration::from_secs(60)).await;
    let mut sub = waiter.subscribe(&k).await.unwrap();
    assert!(sub.is_live());

    // The waiter's pub/sub connection is the only one on this server.
    let killed: i64 = redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "pubsub"])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(killed, 1);
    // Published while nobody is subscribed (the subscriber waits 100 ms
    // before reconnecting): lost.
    releaser.release(&lease).await.unwrap();

    tokio::time::timeout(Duration::from_secs(5), sub.notified())
        .await
        .expect("woken once the subscription is back");
}

async fn pubsub_client_ids(conn: &mut MultiplexedConnection) -> Vec<String> {
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

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A `redis-server` child process of this test, killed when dropped, so a
/// failing test does not leave it behind.
struct PrivateRedis {
    child: Option<Child>,
    port: u16,
}

impl PrivateRedis {
    /// Starts a server on `port` with its data in `dir`; `None` (skip) if
    /// `redis-server` is not installed, unless servers are required.
    fn start(dir: &Path, port: u16, extra: &[&str]) -> Option<Self> {
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

    fn url(&self) -> String {
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
    fn kill(&mut self) {
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
