//! Redis release notifications (pub/sub): the subscriber comes back after
//! its connection is killed and wakes the waiters that missed a release
//! meanwhile, and a user without pub/sub rights waits within its bound.
//!
//! The ACL test uses the shared server (`LEASEHOLD_TEST_REDIS`); tests that
//! kill connections start a private `redis-server` of their own.
#![cfg(all(feature = "conformance", feature = "redis"))]

#[path = "support/redis.rs"]
mod redis_fixtures;

use std::time::{Duration, Instant};

use leasehold::backend::Subscription;
use leasehold::backends::redis::{RedisBackend, RedisOptions};
use leasehold::conformance::server_url;
use leasehold::{Backend, Error, Lease, Locks};
use redis::aio::MultiplexedConnection;
use redis_fixtures::{
    free_port, grant, key, kill_pubsub_clients, pubsub_client_ids, random_prefix, raw, PrivateRedis,
};

/// Whose subscription a [`Subscribed`] setup holds.
enum Waiter {
    /// The releaser's own (one backend, one subscriber connection).
    TheReleaser,
    /// A second backend's: the only subscriber connection on the server.
    AnotherBackend,
}

/// A private `redis-server`, a raw connection to it, a releaser holding
/// `k` for 60 s and a live subscription to `k`: the start of the tests
/// that kill the subscriber's connection.
struct Subscribed {
    conn: MultiplexedConnection,
    releaser: RedisBackend,
    /// Kept: a backend's notifier stops when its last handle is dropped.
    _waiter: RedisBackend,
    lease: Lease,
    sub: Subscription,
    /// Stops the server when dropped; then its directory goes.
    _server: PrivateRedis,
    _dir: tempfile::TempDir,
}

impl Subscribed {
    /// `None` when `redis-server` cannot be started here (the test skips).
    async fn start(waiter: Waiter) -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let server = PrivateRedis::start(dir.path(), free_port(), &[])?;
        let releaser = RedisBackend::connect(&server.url()).await.unwrap();
        let waiter = match waiter {
            Waiter::TheReleaser => releaser.clone(),
            Waiter::AnotherBackend => RedisBackend::connect(&server.url()).await.unwrap(),
        };
        let conn = raw(&server.url()).await;
        let k = key("k");
        let lease = grant(&releaser, &k, Duration::from_secs(60)).await;
        let sub = waiter.subscribe(&k).await.unwrap();
        assert!(sub.is_live());
        Some(Subscribed {
            conn,
            releaser,
            _waiter: waiter,
            lease,
            sub,
            _server: server,
            _dir: dir,
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriber_resubscribes_after_its_connection_is_killed() {
    let Some(mut s) = Subscribed::start(Waiter::TheReleaser).await else {
        return;
    };

    let before = pubsub_client_ids(&mut s.conn).await;
    assert_eq!(before.len(), 1, "one subscriber connection per backend");
    // This server is ours alone, so killing every pub/sub client is safe.
    let killed = kill_pubsub_clients(&mut s.conn).await;
    assert_eq!(killed, 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = pubsub_client_ids(&mut s.conn).await;
        if now.len() == 1 && now != before {
            break;
        }
        assert!(Instant::now() < deadline, "subscriber did not come back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    s.releaser.release(&s.lease).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), s.sub.notified())
        .await
        .expect("a release after the reconnect wakes the waiter");
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
    let Some(mut s) = Subscribed::start(Waiter::AnotherBackend).await else {
        return;
    };

    // The waiter's pub/sub connection is the only one on this server.
    let killed = kill_pubsub_clients(&mut s.conn).await;
    assert_eq!(killed, 1);
    // Published while nobody is subscribed (the subscriber waits 100 ms
    // before reconnecting): lost.
    s.releaser.release(&s.lease).await.unwrap();

    tokio::time::timeout(Duration::from_secs(5), s.sub.notified())
        .await
        .expect("woken once the subscription is back");
}
