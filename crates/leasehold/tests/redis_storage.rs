//! Storage bounded by the keys in use on Redis: every key of an idle lock
//! (the fence, and a semaphore's or reader-writer lock's hash, fence and
//! kind) outlives its last lease by one to one and a half idle windows, and
//! a key that comes back gets a token above every one it had, also on a
//! keyspace written by the previous scheme (fence keys with no ttl). Reads
//! `LEASEHOLD_TEST_REDIS`.
#![cfg(all(feature = "conformance", feature = "redis"))]

#[path = "support/common.rs"]
mod common;
#[path = "support/redis.rs"]
mod redis_fixtures;

use std::time::Duration;

use leasehold::backends::redis::{RedisBackend, RedisOptions};
use leasehold::conformance::server_url;
use leasehold::{AcquireOptions, Locks};
use redis::aio::MultiplexedConnection;
use redis_fixtures::{exists, random_prefix};

/// A store on the shared server under a fresh prefix with `window`, its
/// prefix and a raw connection; `None` (skip) without a server.
async fn store(window: Option<Duration>) -> Option<(Locks, String, MultiplexedConnection)> {
    let url = server_url("LEASEHOLD_TEST_REDIS")?;
    let prefix = random_prefix();
    let backend = RedisBackend::connect_with(
        &url,
        RedisOptions::new()
            .with_prefix(&prefix)
            .with_idle_window(window),
    )
    .await
    .expect("connect to LEASEHOLD_TEST_REDIS");
    let conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    Some((Locks::new(backend), prefix, conn))
}

/// Every Redis key a lock on `k` may leave behind.
fn names(prefix: &str, k: &str) -> Vec<String> {
    [
        "lock", "fence", "kind", "permits", "pfence", "rw", "rwfence",
    ]
    .iter()
    .map(|what| format!("{prefix}:{what}:{{{k}}}"))
    .collect()
}

async fn left(conn: &mut MultiplexedConnection, prefix: &str, keys: &[String]) -> Vec<String> {
    let mut left = Vec::new();
    for k in keys {
        for name in names(prefix, k) {
            // EXISTS expires a key whose ttl ran out (SCAN may not yet).
            if exists(conn, &name).await {
                left.push(name);
            }
        }
    }
    left
}

/// The leases of these tests: the records outlive a lease by the window,
/// so a short one keeps the waits short.
const LEASE: Duration = Duration::from_millis(300);

fn short_lease() -> AcquireOptions {
    AcquireOptions::new().with_ttl(LEASE)
}

/// Takes and gives back a mutex, a permit, a reader and a writer on
/// `k`-based keys, each with a [`LEASE`]; returns those keys and the
/// tokens handed out.
async fn use_every_kind(locks: &Locks, k: &str) -> (Vec<String>, Vec<u64>) {
    let keys: Vec<String> = ["mutex", "sem", "rw"]
        .iter()
        .map(|kind| format!("{k}-{kind}"))
        .collect();
    let mutex = locks.acquire_with(&keys[0], &short_lease()).await.unwrap();
    let permit = locks
        .semaphore(&keys[1], 2)
        .unwrap()
        .acquire_with(&short_lease())
        .await
        .unwrap();
    let rw = locks.rw_lock(&keys[2]).unwrap();
    let reader = rw.read_with(&short_lease()).await.unwrap();
    let mut tokens = vec![mutex.token(), permit.token(), reader.token()];
    for guard in [mutex, permit, reader] {
        guard.release().await.unwrap();
    }
    let writer = rw.write_with(&short_lease()).await.unwrap();
    tokens.push(writer.token());
    writer.release().await.unwrap();
    (keys, tokens)
}

#[tokio::test]
async fn idle_keys_expire_and_come_back_above_every_token() {
    let Some((locks, prefix, mut conn)) = store(Some(Duration::from_millis(800))).await else {
        return;
    };
    let mut all_keys = Vec::new();
    let mut before = Vec::new();
    for i in 0..20 {
        let (keys, tokens) = use_every_kind(&locks, &format!("k{i}")).await;
        all_keys.extend(keys);
        before.push(tokens);
    }
    // The last keys used, read first (checking every key's records below
    // takes a round trip each, long on a loaded machine): a fence lives one and a
    // half windows from its creation (1200 ms); a semaphore's kind outlives
    // its last permit by at least the window (the lease and one and a half
    // windows, 1500 ms, from the grant).
    for (name, ttls) in [
        ("fence:{k19-mutex}", 1..=1200),
        ("pfence:{k19-sem}", 1..=1200),
        ("rwfence:{k19-rw}", 1..=1200),
        ("kind:{k19-sem}", 600..=1500),
    ] {
        let name = format!("{prefix}:{name}");
        let ttl = pttl(&mut conn, &name).await;
        assert!(ttls.contains(&ttl), "{name}: pttl {ttl}");
    }
    let held = locks.try_acquire("held").await.unwrap();
    assert!(!left(&mut conn, &prefix, &all_keys).await.is_empty());

    tokio::time::sleep(Duration::from_millis(1700)).await;
    assert_eq!(
        left(&mut conn, &prefix, &all_keys).await,
        Vec::<String>::new()
    );
    // The held lock stays held, its token in its lock key (its fence lives
    // one and a half windows from its creation, held or not).
    assert!(exists(&mut conn, &format!("{prefix}:lock:{{held}}")).await);
    let info = locks.inspect("held").await.unwrap().expect("held");
    assert_eq!(info.token, held.token());

    for (i, tokens) in before.into_iter().enumerate() {
        let (_, again) = use_every_kind(&locks, &format!("k{i}")).await;
        let top = tokens.into_iter().max().unwrap();
        assert!(
            again.iter().all(|&t| t > top),
            "k{i}: {again:?} after {top}"
        );
    }
    held.release().await.unwrap();
}

/// The PTTL of `name` in ms (-2: gone, -1: no ttl).
async fn pttl(conn: &mut MultiplexedConnection, name: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(name)
        .query_async(conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn slots_and_kind_outlive_a_longer_next_lease_by_the_window() {
    let Some((locks, prefix, mut conn)) = store(Some(Duration::from_millis(800))).await else {
        return;
    };
    // A short permit first, then one of 3 s, released at once: a release
    // writes no ttl, so the grant must have kept the slots hash and the kind
    // past its lease by the window (a mutex key must not take the key while
    // a permit may live).
    let long = AcquireOptions::new().with_ttl(Duration::from_secs(3));
    let sem = locks.semaphore("sem", 2).unwrap();
    for options in [short_lease(), long] {
        let a = sem.acquire_with(&short_lease()).await.unwrap();
        let b = sem.acquire_with(&options).await.unwrap();
        a.release().await.unwrap();
        b.release().await.unwrap();
    }
    let name = format!("{prefix}:kind:{{sem}}");
    let ttl = pttl(&mut conn, &name).await;
    assert!((3700..=4200).contains(&ttl), "{name}: pttl {ttl}");
}

/// A fence lives one and a half windows from its creation, whatever its key
/// does: no lease needs it, since a lease carries its token in its own
/// record. One that expires under a held mutex or permit breaks nothing,
/// and the next grant starts above every token.
#[tokio::test]
async fn a_fence_that_expires_under_a_held_lease_breaks_nothing() {
    let Some((locks, prefix, mut conn)) = store(Some(Duration::from_millis(200))).await else {
        return;
    };
    let held = AcquireOptions::new().with_ttl(Duration::from_secs(5));
    let mutex = locks.acquire_with("job", &held).await.unwrap();
    let sem = locks.semaphore("pool", 2).unwrap();
    let permit = sem.acquire_with(&held).await.unwrap();
    let fences = [
        format!("{prefix}:fence:{{job}}"),
        format!("{prefix}:pfence:{{pool}}"),
    ];
    for fence in &fences {
        let ttl = pttl(&mut conn, fence).await;
        assert!((0..=300).contains(&ttl), "{fence}: pttl {ttl}");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for fence in &fences {
        assert!(!exists(&mut conn, fence).await, "{fence} outlived its ttl");
    }
    for guard in [&mutex, &permit] {
        assert!(
            locks
                .backend()
                .renew(guard.lease(), Duration::from_secs(5))
                .await
                .unwrap(),
            "{}: renewal refused without its fence",
            guard.key()
        );
        assert!(!guard.is_lost(), "{}", guard.key());
    }
    let info = locks.inspect("job").await.unwrap().expect("job is held");
    assert_eq!(
        info.token,
        mutex.token(),
        "inspect reads the token from the lease"
    );
    let (mutex_token, permit_token) = (mutex.token(), permit.token());
    mutex.release().await.unwrap();
    permit.release().await.unwrap();
    assert!(locks.inspect("job").await.unwrap().is_none(), "released");
    let again = locks.try_acquire("job").await.unwrap();
    assert!(
        again.token() > mutex_token,
        "{} after {mutex_token}",
        again.token()
    );
    again.release().await.unwrap();
    let again = sem.try_acquire().await.unwrap();
    assert!(
        again.token() > permit_token,
        "{} after {permit_token}",
        again.token()
    );
    again.release().await.unwrap();
}

#[tokio::test]
async fn a_keyspace_of_the_previous_scheme_is_upgraded_in_place() {
    let Some((locks, prefix, mut conn)) = store(Some(Duration::from_millis(500))).await else {
        return;
    };
    // A fence as the previous version left it: no ttl, at 41.
    let fence = format!("{prefix}:fence:{{order}}");
    let _: () = redis::cmd("SET")
        .arg(&fence)
        .arg(41)
        .query_async(&mut conn)
        .await
        .unwrap();
    let guard = locks.acquire_with("order", &short_lease()).await.unwrap();
    assert_eq!(guard.token(), 42, "the old counter goes on");
    guard.release().await.unwrap();
    let ttl = pttl(&mut conn, &fence).await;
    assert!(ttl > 0, "the old fence key got a ttl: {ttl}");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(!exists(&mut conn, &fence).await);
    let guard = locks.try_acquire("order").await.unwrap();
    assert!(guard.token() > 42, "{}", guard.token());
    guard.release().await.unwrap();
}

#[tokio::test]
async fn never_keeps_the_fence_forever() {
    let Some((locks, prefix, mut conn)) = store(None).await else {
        return;
    };
    let guard = locks.try_acquire("job").await.unwrap();
    guard.release().await.unwrap();
    let ttl = pttl(&mut conn, &format!("{prefix}:fence:{{job}}")).await;
    assert_eq!(ttl, -1, "no ttl with idle_window=never");
}

#[tokio::test]
async fn bad_windows_are_refused_before_any_io() {
    common::assert_bad_windows_refused(
        RedisBackend::connect_with(
            "redis://127.0.0.1:1",
            RedisOptions::new().with_idle_window(Some(Duration::ZERO)),
        ),
        &["redis://127.0.0.1:1?idle_window=1d"],
    )
    .await;
}

/// A raw GET of `name`.
async fn get(conn: &mut MultiplexedConnection, name: &str) -> Option<String> {
    redis::cmd("GET").arg(name).query_async(conn).await.unwrap()
}

/// A key's queue (docs/redis.md, "The queue") is storage of its own: its
/// keys and the kind's `q` live at least as long as every live entry and go
/// by themselves after the last one ends; a release or grant that finds the
/// queue drained unmarks the key, so its next grant and release take the
/// short path again (kind absent, no byte 1 at the end of the lock value).
#[tokio::test]
async fn a_queue_goes_with_its_last_entry() {
    use leasehold::backend::{Acquire, AcquireRequest};
    use leasehold::{Backend, Key};
    let Some((_, prefix, mut conn)) = store(Some(Duration::from_millis(800))).await else {
        return;
    };
    let url = server_url("LEASEHOLD_TEST_REDIS").unwrap();
    let backend = RedisBackend::connect_with(&url, RedisOptions::new().with_prefix(&prefix))
        .await
        .unwrap();
    let k = Key::new("q").unwrap();
    let [lock, kind, queue, waiters] =
        ["lock", "kind", "queue", "waiters"].map(|what| format!("{prefix}:{what}:{{q}}"));
    let request = |entry: Option<Duration>| {
        let req = AcquireRequest::new(k.clone(), Duration::from_secs(10), "w").unwrap();
        match entry {
            Some(ttl) => req.with_queue_entry(ttl, 1),
            None => req,
        }
    };
    let grant = |answer: Acquire| match answer {
        Acquire::Granted(lease) => lease,
        other => panic!("expected a grant: {other:?}"),
    };

    // An entry that dies: the queue's keys outlive it, then go by themselves.
    let holder = grant(backend.try_acquire(&request(None)).await.unwrap());
    assert!(
        !get(&mut conn, &lock).await.unwrap().ends_with('\u{1}'),
        "nobody waits: no mark"
    );
    let entry = Duration::from_millis(300);
    let dead = request(Some(entry));
    assert!(matches!(
        backend.try_acquire(&dead).await.unwrap(),
        Acquire::Busy(_)
    ));
    assert_eq!(get(&mut conn, &kind).await.as_deref(), Some("q"));
    assert!(get(&mut conn, &lock).await.unwrap().ends_with('\u{1}'));
    for name in [&kind, &queue, &waiters] {
        let ttl = pttl(&mut conn, name).await;
        assert!((300..=600).contains(&ttl), "{name}: pttl {ttl}");
    }
    // The label read back has no mark in it.
    let info = backend.inspect(&k).await.unwrap().expect("held");
    assert_eq!(info.holder, "w");
    tokio::time::sleep(Duration::from_millis(700)).await;
    for name in [&kind, &queue, &waiters] {
        assert!(!exists(&mut conn, name).await, "{name} outlived the queue");
    }
    // Its release finds nobody (the mark is stale) and frees the key.
    backend.release(&holder).await.unwrap();
    assert!(!exists(&mut conn, &lock).await);

    // A queue drained by a hand-over: unmarked in the same step.
    let holder = grant(backend.try_acquire(&request(None)).await.unwrap());
    let waiter = request(Some(Duration::from_secs(2)));
    assert!(matches!(
        backend.try_acquire(&waiter).await.unwrap(),
        Acquire::Busy(_)
    ));
    backend.release(&holder).await.unwrap();
    let value = get(&mut conn, &lock).await.expect("handed over");
    assert!(
        value.starts_with(&format!("{}#", waiter.owner())),
        "{value}"
    );
    assert!(!value.ends_with('\u{1}'), "nobody left: no mark");
    for name in [&kind, &queue, &waiters] {
        assert!(!exists(&mut conn, name).await, "{name} outlived the queue");
    }
    // The head's repeat claims it: the same grant.
    let claimed = grant(backend.try_acquire(&waiter).await.unwrap());
    assert!(claimed.token() > holder.token());
    backend.release(&claimed).await.unwrap();
    assert!(!exists(&mut conn, &lock).await);
}
