//! The shared conformance suite on Redis Cluster
//! (`LEASEHOLD_TEST_REDIS_CLUSTER`, a `redis+cluster://` URL; see
//! `scripts/services/redis-cluster.sh`), woken and polling, one random key
//! prefix per test. The suite's keys hash to slots on every primary; the
//! test below makes sure of it with keys picked by the cluster's own slot
//! map, the case that failed with `MOVED` before the store spoke cluster.
#![cfg(all(feature = "conformance", feature = "redis"))]

use std::collections::BTreeMap;
use std::time::Duration;

use leasehold::backends::redis::{RedisBackend, RedisOptions};
use leasehold::conformance::{server_url, TestStore};
use leasehold::{Backend, Error, Key};
use redis_fixtures::{grant, random_prefix};

#[path = "support/redis.rs"]
mod redis_fixtures;

const URL_VAR: &str = "LEASEHOLD_TEST_REDIS_CLUSTER";

async fn store() -> Option<TestStore> {
    store_with(RedisOptions::new()).await
}

async fn store_with(options: RedisOptions) -> Option<TestStore> {
    redis_fixtures::conformance_store(URL_VAR, "redis+cluster", options).await
}

leasehold::conformance_tests!(store; options, unreachable, queue, hand_off);

mod polling {
    async fn store() -> Option<leasehold::conformance::TestStore> {
        Some(super::store().await?.polling_only())
    }

    leasehold::conformance_tests!(store);
}

/// Every call confirmed by `WAIT 1` (each primary has one replica).
mod replicated {
    use leasehold::backends::redis::RedisOptions;

    async fn store() -> Option<leasehold::conformance::TestStore> {
        super::store_with(RedisOptions::new().with_min_replicas(1)).await
    }

    // The queue too: every script that hands over runs in a pipeline with
    // its WAIT (exec.rs).
    leasehold::conformance_tests!(store; queue);
}

/// A plain connection to the first seed node of `url`.
async fn seed_connection(url: &str) -> redis::aio::MultiplexedConnection {
    let first = url
        .strip_prefix("redis+cluster://")
        .and_then(|nodes| nodes.split([',', '?', '/']).next())
        .expect("a redis+cluster:// URL");
    redis::Client::open(format!("redis://{first}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the first seed node")
}

/// The primary (`host:port`) serving each slot range, from `CLUSTER SLOTS`.
async fn slot_owners(conn: &mut redis::aio::MultiplexedConnection) -> Vec<(u16, u16, String)> {
    let ranges: Vec<Vec<redis::Value>> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(conn)
        .await
        .unwrap();
    ranges
        .into_iter()
        .map(|range| {
            let start: u16 = redis::from_redis_value(range[0].clone()).unwrap();
            let end: u16 = redis::from_redis_value(range[1].clone()).unwrap();
            let node: Vec<redis::Value> = redis::from_redis_value(range[2].clone()).unwrap();
            let host: String = redis::from_redis_value(node[0].clone()).unwrap();
            let port: u16 = redis::from_redis_value(node[1].clone()).unwrap();
            (start, end, format!("{host}:{port}"))
        })
        .collect()
}

/// Two keys on each primary of the cluster, found by asking it which slot
/// `backend`'s lock key of each hashes to and who owns that slot.
async fn keys_on_every_primary(url: &str, backend: &RedisBackend) -> BTreeMap<String, Vec<Key>> {
    let mut seed = seed_connection(url).await;
    let owners = slot_owners(&mut seed).await;
    let mut by_primary: BTreeMap<String, Vec<Key>> = BTreeMap::new();
    for i in 0..1000 {
        let key = Key::new(format!("job-{i}")).unwrap();
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(backend.lock_key(&key))
            .query_async(&mut seed)
            .await
            .unwrap();
        let (_, _, primary) = owners
            .iter()
            .find(|(start, end, _)| (*start..=*end).contains(&slot))
            .expect("every slot is served");
        let keys = by_primary.entry(primary.clone()).or_default();
        if keys.len() < 2 {
            keys.push(key);
        }
        if by_primary.len() == 3 && by_primary.values().all(|k| k.len() == 2) {
            break;
        }
    }
    assert_eq!(
        by_primary.len(),
        3,
        "keys on all three primaries: {by_primary:?}"
    );
    by_primary
}

/// The test cluster and a fresh key prefix: the backends of one test
/// share the prefix, so they see each other's locks and no other test's.
struct Cluster {
    url: String,
    prefix: String,
}

impl Cluster {
    /// `None` (skip) when the cluster's URL is unset.
    fn new() -> Option<Self> {
        Some(Cluster {
            url: server_url(URL_VAR)?,
            prefix: random_prefix(),
        })
    }

    /// A backend with `options` under the test's prefix.
    async fn backend(&self, options: RedisOptions) -> RedisBackend {
        RedisBackend::connect_with(&self.url, options.with_prefix(&self.prefix))
            .await
            .expect("connect to the cluster")
    }
}

#[tokio::test]
async fn keys_on_every_primary_are_granted_listed_and_released() {
    let Some(cluster) = Cluster::new() else {
        return;
    };
    let backend = cluster.backend(RedisOptions::new()).await;
    let by_primary = keys_on_every_primary(&cluster.url, &backend).await;
    let ttl = Duration::from_secs(30);
    let mut held = Vec::new();
    for key in by_primary.values().flatten() {
        let lease = grant(&backend, key, ttl).await;
        assert!(backend.renew(&lease, ttl).await.unwrap(), "{key} renews");
        held.push(lease);
    }
    let listed: Vec<(String, u64)> = backend
        .list("")
        .await
        .unwrap()
        .into_iter()
        .map(|info| (info.key.to_string(), info.token))
        .collect();
    let mut expected: Vec<(String, u64)> = held
        .iter()
        .map(|lease| (lease.key().to_string(), lease.token()))
        .collect();
    expected.sort();
    assert_eq!(listed, expected, "list sees the keys of every primary");
    for lease in &held {
        backend.release(lease).await.unwrap();
        let key = lease.key();
        assert!(
            backend.inspect(key).await.unwrap().is_none(),
            "{key} released"
        );
    }
    // The fences stay: the next grant on each key gets a higher token.
    for lease in &held {
        let again = grant(&backend, lease.key(), ttl).await;
        assert!(
            again.token() > lease.token(),
            "{:?}: token {} after {}",
            lease.key(),
            again.token(),
            lease.token()
        );
        backend.release(&again).await.unwrap();
    }
}

/// The waiter's one pub/sub connection goes to the first seed node; a
/// release on any primary, by another backend (so no in-process shortcut
/// wakes it), reaches it through the cluster bus.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_on_any_primary_wakes_a_waiter() {
    let Some(cluster) = Cluster::new() else {
        return;
    };
    let waiter = cluster.backend(RedisOptions::new()).await;
    let holder = cluster.backend(RedisOptions::new()).await;
    let by_primary = keys_on_every_primary(&cluster.url, &holder).await;
    for (primary, keys) in &by_primary {
        let key = &keys[0];
        let lease = grant(&holder, key, Duration::from_secs(60)).await;
        let mut sub = waiter.subscribe(key).await.unwrap();
        assert!(sub.is_live(), "the waiter listens");
        holder.release(&lease).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), sub.notified())
            .await
            .unwrap_or_else(|_| panic!("a release of {key:?} on {primary} wakes the waiter"));
    }
}

/// With more replicas asked for than the cluster has (one per primary), a
/// grant is refused as retryable and not left behind; with one, a primary
/// that forgot the scripts (as a promoted replica may) is taught them again.
#[tokio::test]
async fn min_replicas_refuses_unconfirmed_grants_and_reloads_scripts() {
    let Some(cluster) = Cluster::new() else {
        return;
    };
    let url = &cluster.url;
    let plain = cluster.backend(RedisOptions::new()).await;
    let too_many = cluster
        .backend(
            RedisOptions::new()
                .with_min_replicas(2)
                .with_response_timeout(Duration::from_millis(400)),
        )
        .await;
    let by_primary = keys_on_every_primary(url, &plain).await;
    let key = &by_primary.values().next().unwrap()[0];
    let req =
        leasehold::backend::AcquireRequest::new(key.clone(), Duration::from_secs(30), "t").unwrap();
    match too_many.try_acquire(&req).await {
        Err(e @ Error::Unavailable { .. }) => {
            assert!(
                e.to_string().contains("confirmed by 1 of the 2 replicas"),
                "{e}"
            )
        }
        other => panic!("an unconfirmed grant must fail as Unavailable, got {other:?}"),
    }
    assert!(
        plain.inspect(key).await.unwrap().is_none(),
        "the unconfirmed grant was released"
    );

    let confirmed = cluster
        .backend(RedisOptions::new().with_min_replicas(1))
        .await;
    let mut seed = seed_connection(url).await;
    for (_, _, primary) in slot_owners(&mut seed).await {
        let mut node = redis::Client::open(format!("redis://{primary}"))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut node)
            .await
            .unwrap();
    }
    for key in by_primary.values().flatten() {
        let lease = grant(&confirmed, key, Duration::from_secs(30)).await;
        assert!(confirmed
            .renew(&lease, Duration::from_secs(30))
            .await
            .unwrap());
        confirmed.release(&lease).await.unwrap();
    }
}
