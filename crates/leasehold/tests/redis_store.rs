//! Redis-specific properties beyond the shared suite: the key namespace on a
//! real server, expiry without resurrection, the documented fenced write,
//! a caller's connection, and fence durability across a server restart.
//!
//! Tests on the shared server read `LEASEHOLD_TEST_REDIS`; the restart test
//! starts a private `redis-server` of its own.
#![cfg(all(feature = "conformance", feature = "redis"))]

#[path = "support/redis.rs"]
mod redis_fixtures;

use std::time::Duration;

use leasehold::backends::redis::{RedisBackend, RedisOptions};
use leasehold::conformance::server_url;
use leasehold::{Backend, Error, Key, Lease, Locks};
use redis::aio::MultiplexedConnection;
use redis_fixtures::{exists, free_port, grant, key, random_prefix, shared, PrivateRedis};

/// A backend on the shared server under a fresh prefix, a raw connection,
/// and the backend's 30 s lease on key `k`; `None` (skip) without a server.
async fn holding(k: &str) -> Option<(RedisBackend, MultiplexedConnection, Key, Lease)> {
    let (backend, conn) = shared(&random_prefix()).await?;
    let k = key(k);
    let lease = grant(&backend, &k, Duration::from_secs(30)).await;
    Some((backend, conn, k, lease))
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
    let Some((backend, mut conn, k, live)) = holding("k").await else {
        return;
    };
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
            .arg(format!("{}#{}:", live.owner(), live.token()))
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
async fn the_lock_key_carries_the_live_token() {
    let Some((backend, mut conn, k, first)) = holding("orders:{42}").await else {
        return;
    };
    backend.release(&first).await.unwrap();
    let lease = grant(&backend, &k, Duration::from_secs(30)).await;
    let value: String = redis::cmd("GET")
        .arg(backend.lock_key(&k))
        .query_async(&mut conn)
        .await
        .unwrap();
    // `<owner>#<token>:<holder label>`.
    assert!(
        value.starts_with(&format!("{}#{}:", lease.owner(), lease.token())),
        "{value}"
    );
    // The counter the next grant goes on from.
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
if not holder or string.sub(holder, 1, #ARGV[1]) ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[2], 'stock', ARGV[3], 'fence', ARGV[2])
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
            .key(&data)
            .arg(format!("{}#{}:", lease.owner(), lease.token()))
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
