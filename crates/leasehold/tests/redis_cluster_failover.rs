//! A primary of a private Redis Cluster (3 primaries, 3 replicas, started
//! by this test) is killed under a lease granted with `min_replicas=1`:
//! calls fail as retryable `Unavailable` (never a panic or a permanent
//! error) until the cluster promotes the replica; then the lease is there
//! with its token; `min_replicas=1` refuses to confirm while the promoted
//! primary has no replica, and works again once the old primary rejoins as
//! its replica; the next grant's token is higher. One kill, one key: not
//! the torture run the issue asks for (see docs/redis.md), but the path it
//! relies on.
#![cfg(all(feature = "conformance", feature = "redis"))]

#[path = "support/redis.rs"]
mod redis_fixtures;

use std::process::Command;
use std::time::{Duration, Instant};

use leasehold::backend::{Acquire, AcquireRequest};
use leasehold::backends::redis::{RedisBackend, RedisOptions};
use leasehold::{Backend, Error, Key};
use redis_fixtures::{free_port, grant, PrivateRedis};

/// The node (`host:port`) owning `slot` as primary, and its first replica.
fn slot_nodes(port: u16, slot: u16) -> Option<(String, Option<String>)> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
    let mut conn = client
        .get_connection_with_timeout(Duration::from_secs(1))
        .ok()?;
    let ranges: Vec<Vec<redis::Value>> =
        redis::cmd("CLUSTER").arg("SLOTS").query(&mut conn).ok()?;
    let addr = |v: &redis::Value| -> Option<String> {
        let node: Vec<redis::Value> = redis::from_redis_value(v.clone()).ok()?;
        let host: String = redis::from_redis_value(node.first()?.clone()).ok()?;
        let port: u16 = redis::from_redis_value(node.get(1)?.clone()).ok()?;
        Some(format!("{host}:{port}"))
    };
    ranges.iter().find_map(|range| {
        let start: u16 = redis::from_redis_value(range.first()?.clone()).ok()?;
        let end: u16 = redis::from_redis_value(range.get(1)?.clone()).ok()?;
        (start..=end)
            .contains(&slot)
            .then(|| Some((addr(range.get(2)?)?, range.get(3).and_then(addr))))?
    })
}

/// A cluster node on `port` (and `bus` for the cluster bus), its state in
/// `dir`: started again on the same three, it rejoins the cluster.
fn start_node(dir: &std::path::Path, port: u16, bus: u16) -> Option<PrivateRedis> {
    let bus = bus.to_string();
    let extra = [
        "--cluster-enabled",
        "yes",
        "--cluster-port",
        &bus,
        "--cluster-node-timeout",
        "1000",
        "--appendonly",
        "no",
    ];
    PrivateRedis::start(dir, port, &extra)
}

fn cluster_ok(port: u16) -> bool {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(1)))
        .and_then(|mut c| redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut c))
        .is_ok_and(|info| info.contains("cluster_state:ok"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_is_replaced_and_the_lease_and_fence_survive() {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = Vec::new();
    let mut starts = Vec::new();
    for i in 0..6 {
        let node_dir = dir.path().join(i.to_string());
        std::fs::create_dir(&node_dir).unwrap();
        let (port, bus) = (free_port(), free_port());
        let Some(node) = start_node(&node_dir, port, bus) else {
            return;
        };
        nodes.push(node);
        starts.push((node_dir, port, bus));
    }
    let addrs: Vec<String> = nodes
        .iter()
        .map(|n| n.url().trim_start_matches("redis://").to_owned())
        .collect();
    let created = Command::new("redis-cli")
        .arg("--cluster")
        .arg("create")
        .args(&addrs)
        .args(["--cluster-replicas", "1", "--cluster-yes"])
        .output()
        .expect("redis-cli runs");
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stdout)
    );
    let port_of = |addr: &str| addr.rsplit(':').next().unwrap().parse::<u16>().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !addrs.iter().all(|a| cluster_ok(port_of(a))) {
        assert!(Instant::now() < deadline, "the cluster did not form");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let url = format!("redis+cluster://{}", addrs.join(","));
    let options = RedisOptions::new()
        .with_min_replicas(1)
        .with_persistence_check(false);
    let backend = RedisBackend::connect_with(&url, options).await.unwrap();
    let key = Key::new("failover").unwrap();
    let ttl = Duration::from_secs(60);
    // Replicas finish their first sync a moment after the cluster is ok;
    // until then a grant is unconfirmed, refused and retried.
    let request = AcquireRequest::new(key.clone(), ttl, "failover-test").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut unconfirmed = 0;
    let lease = loop {
        match backend.try_acquire(&request).await {
            Ok(Acquire::Granted(lease)) => break lease,
            Ok(busy) => panic!("an unconfirmed grant was left held: {busy:?}"),
            Err(Error::Unavailable { .. }) if Instant::now() < deadline => {
                unconfirmed += 1;
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("no confirmed grant: {e}"),
        }
    };
    eprintln!("{unconfirmed} grants were refused while the replicas synced");

    let slot = {
        let mut conn = redis::Client::open(format!("redis://{}", addrs[0]))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(backend.lock_key(&key))
            .query_async::<u16>(&mut conn)
            .await
            .unwrap()
    };
    // Every node learns the replicas' roles over the bus; ask until the seed
    // node knows the slot's replica.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (primary, replica) = loop {
        if let Some((primary, Some(replica))) = slot_nodes(port_of(&addrs[0]), slot) {
            break (primary, replica);
        }
        assert!(
            Instant::now() < deadline,
            "the slot's primary has no replica"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let victim = addrs.iter().position(|a| *a == primary).unwrap();
    nodes[victim].kill();

    // Until the replica is promoted, calls fail as retryable. After, the
    // lease is there with its token (it was confirmed on that replica)...
    let plain = RedisBackend::connect_with(&url, RedisOptions::new().with_persistence_check(false))
        .await
        .unwrap();
    let mut unavailable = 0;
    let mut last = String::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let info = loop {
        match plain.inspect(&key).await {
            Ok(info) => break info.expect("the confirmed grant survived the failover"),
            Err(e @ Error::Unavailable { .. }) => {
                unavailable += 1;
                last = e.to_string();
            }
            Err(e) => panic!("a failover must look transient, got {e}"),
        }
        assert!(
            Instant::now() < deadline,
            "no primary took over the slot: {unavailable} calls Unavailable, the last {last}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!("{unavailable} calls were Unavailable during the failover (last: {last})");
    assert_eq!(info.token, lease.token());
    let (now_primary, _) = slot_nodes(port_of(&replica), slot).unwrap();
    assert_eq!(now_primary, replica, "the replica serves the slot now");

    // ... but the promoted primary has no replica left, so min_replicas=1
    // refuses to confirm anything on its slots (retryable)...
    match backend.renew(&lease, ttl).await {
        Err(e @ Error::Unavailable { .. }) => {
            assert!(e.to_string().contains("confirmed by 0 of the 1"), "{e}")
        }
        other => panic!("no replica left to confirm: expected Unavailable, got {other:?}"),
    }
    // ... until the old primary comes back, as the new one's replica.
    let (node_dir, port, bus) = &starts[victim];
    nodes[victim] = start_node(node_dir, *port, *bus).expect("the old primary restarts");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match backend.renew(&lease, ttl).await {
            Ok(renewed) => {
                assert!(renewed, "the holder still holds the lease");
                break;
            }
            Err(Error::Unavailable { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("the rejoined replica never confirmed: {e}"),
        }
    }

    backend.release(&lease).await.unwrap();
    let next = grant(&backend, &key, ttl).await;
    assert!(
        next.token() > lease.token(),
        "token {} after {}: the fence went backwards",
        next.token(),
        lease.token()
    );
}
