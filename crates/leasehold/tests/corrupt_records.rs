//! A lease record damaged by hand (a negative fence, an owner that is not
//! hex, an expiry past any ttl, a key no caller could pass) is reported the
//! same way by every store: `Error::Backend` naming the store, with a
//! `CorruptRecord` source. Each test writes such records with the store's
//! own driver, then reads them through the backend.
//!
//! Network stores read `LEASEHOLD_TEST_POSTGRES`, `LEASEHOLD_TEST_REDIS`
//! and `LEASEHOLD_TEST_MONGODB` (skipped when unset, unless
//! `LEASEHOLD_REQUIRE_SERVERS=1`).
#![cfg(feature = "conformance")]
#![allow(dead_code)]

#[path = "support/common.rs"]
mod common;
#[cfg(feature = "mongodb")]
#[path = "support/mongodb.rs"]
mod mongodb_fixtures;
#[cfg(feature = "postgres")]
#[path = "support/postgres.rs"]
mod postgres;
#[cfg(feature = "redis")]
#[path = "support/redis.rs"]
mod redis_fixtures;

use std::time::Duration;

use leasehold::backend::{Acquire, AcquireRequest, CorruptRecord};
use leasehold::{Backend, Error, Key, Result};

/// A well-formed owner id, as stores keep it.
const OWNER: &str = "0123456789abcdef0123456789abcdef";

fn key(k: &str) -> Key {
    Key::new(k).unwrap()
}

/// Checks that `result` is the corrupt-record error of `store`, whose
/// problem mentions `expected`.
fn assert_corrupt<T: std::fmt::Debug>(result: Result<T>, store: &str, expected: &str) {
    let e = result.expect_err("a corrupt record must not read as a lease");
    assert!(matches!(e, Error::Backend { .. }), "{e:?}");
    assert!(!e.is_retryable());
    assert_eq!(e.store(), Some(store), "{e}");
    let corrupt = std::error::Error::source(&e)
        .and_then(|s| s.downcast_ref::<CorruptRecord>())
        .unwrap_or_else(|| panic!("no CorruptRecord source: {e:?}"));
    assert!(
        corrupt.problem().contains(expected),
        "{:?} lacks {expected:?}",
        corrupt.problem()
    );
    assert!(e
        .to_string()
        .starts_with(&format!("store error ({store}): corrupt lease record")));
}

/// Every corruption every store can hold, read through `backend` after
/// `plant` wrote them under `p` (a fresh prefix): the keys are
/// `{p}fence`, `{p}owner`, `{p}expiry`, and `{p}ctl\n`; `{p}grant` has an
/// expired record whose fence is negative.
async fn check_reads(backend: &dyn Backend, store: &str, p: &str, owner_problem: &str) {
    let fence = backend.inspect(&key(&format!("{p}fence"))).await;
    assert_corrupt(fence, store, "fence");
    let owner = backend.inspect(&key(&format!("{p}owner"))).await;
    assert_corrupt(owner, store, owner_problem);
    let expiry = backend.inspect(&key(&format!("{p}expiry"))).await;
    assert_corrupt(expiry, store, "past any lease");
    let listed = backend.list(&format!("{p}ctl")).await;
    assert_corrupt(listed, store, "the key must not contain control characters");
    let req = AcquireRequest::new(key(&format!("{p}grant")), Duration::from_secs(5), "t").unwrap();
    let granted = backend.try_acquire(&req).await;
    assert_corrupt(
        granted.map(|a| matches!(a, Acquire::Granted(_))),
        store,
        "is negative",
    );
    // Sound records beside them still read.
    assert!(backend
        .inspect(&key(&format!("{p}absent")))
        .await
        .unwrap()
        .is_none());
}

/// The SQL stores' corrupt records for [`check_reads`], as `INSERT`s into
/// the lease table `table` (key, fence, owner, holder and the expiry column
/// `expiry_column`, named so that the table's later columns, such as the
/// key's kind, keep their defaults); `later`,
/// `far` and `past` are the dialect's expiry expressions for a minute
/// ahead, beyond any ttl, and already expired.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
fn corrupt_inserts(
    table: &str,
    expiry_column: &str,
    p: &str,
    later: &str,
    far: &str,
    past: &str,
) -> Vec<String> {
    [
        ("fence", "-3", OWNER, later),
        ("owner", "1", "not-hex", later),
        ("expiry", "1", OWNER, far),
        ("ctl\n", "1", OWNER, later),
        ("grant", "-3", OWNER, past),
    ]
    .iter()
    .map(|(suffix, fence, owner, expiry)| {
        format!(
            "INSERT INTO {table} (key, fence, owner, holder, {expiry_column}) \
             VALUES ('{p}{suffix}', {fence}, '{owner}', 'h', {expiry})"
        )
    })
    .collect()
}

fn prefix() -> String {
    format!("corrupt{:08x}:", rand::random::<u32>())
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_reports_corrupt_records() {
    use leasehold::backends::sqlite::SqliteBackend;

    let dir = tempfile::tempdir().unwrap();
    let backend = SqliteBackend::open(dir.path().join("locks.db"))
        .await
        .unwrap();
    let p = prefix();
    // The store's own clock (registered on the backend's connections).
    let later = "leasehold_now_ms() + 60000";
    for insert in corrupt_inserts(
        "leasehold_locks",
        "expires_at_ms",
        &p,
        later,
        "9000000000000000",
        "0",
    ) {
        sqlx::query(&insert).execute(backend.pool()).await.unwrap();
    }
    check_reads(&backend, "sqlite", &p, "owner \"not-hex\"").await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_reports_corrupt_records() {
    let Some(url) = postgres::url() else {
        return;
    };
    let table = common::unique("corrupt");
    let backend = postgres::on_table(&url, &table).await;
    let p = prefix();
    let table_sql = format!("\"{table}\"");
    let inserts = corrupt_inserts(
        &table_sql,
        "expires_at",
        &p,
        "clock_timestamp() + interval '1 minute'",
        "clock_timestamp() + interval '100 years'",
        "clock_timestamp() - interval '1 minute'",
    );
    for insert in inserts {
        sqlx::query(&insert).execute(backend.pool()).await.unwrap();
    }
    check_reads(&backend, "postgres", &p, "owner \"not-hex\"").await;
    postgres::drop_table(backend.pool(), &table_sql).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_reports_corrupt_records() {
    let ns = redis_fixtures::random_prefix();
    let Some((backend, mut conn)) = redis_fixtures::shared(&ns).await else {
        return;
    };
    let p = prefix();
    let lease = format!("{OWNER}:h");
    for (k, fence, value, pttl) in [
        (format!("{p}fence"), "-3", lease.as_str(), 60_000_i64),
        (format!("{p}owner"), "1", "short:h", 60_000_i64),
        (
            format!("{p}expiry"),
            "1",
            lease.as_str(),
            9_000_000_000_000_i64,
        ),
        (format!("{p}ctl\n"), "1", lease.as_str(), 60_000_i64),
    ] {
        // A key no caller could pass cannot be a `Key`: write its names by
        // the store's layout (keys.rs) with the text spliced in.
        let (lock, fence_key) = match Key::new(k.clone()) {
            Ok(k) => (backend.lock_key(&k), backend.fence_key(&k)),
            Err(_) => (format!("{ns}:lock:{{{k}}}"), format!("{ns}:fence:{{{k}}}")),
        };
        redis::cmd("SET")
            .arg(&lock)
            .arg(value)
            .arg("PX")
            .arg(pttl)
            .exec_async(&mut conn)
            .await
            .unwrap();
        redis::cmd("SET")
            .arg(&fence_key)
            .arg(fence)
            .exec_async(&mut conn)
            .await
            .unwrap();
    }
    // A grant over a negative fence: INCR makes it -2.
    let grant = key(&format!("{p}grant"));
    redis::cmd("SET")
        .arg(backend.fence_key(&grant))
        .arg(-3)
        .exec_async(&mut conn)
        .await
        .unwrap();
    check_reads(&backend, "redis", &p, "has no owner").await;
    let mut cleanup = redis::cmd("EVAL");
    cleanup
        .arg("for _, k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('DEL', k) end")
        .arg(0)
        .arg(format!("{ns}:*"));
    cleanup.exec_async(&mut conn).await.unwrap();
}

#[cfg(feature = "mongodb")]
#[tokio::test]
async fn mongodb_reports_corrupt_records() {
    use mongodb::bson::{doc, DateTime};

    let Some(backend) = mongodb_fixtures::fresh_backend().await else {
        return;
    };
    let p = prefix();
    let now = DateTime::now().timestamp_millis();
    let later = DateTime::from_millis(now + 60_000);
    let docs = [
        doc! { "_id": format!("{p}fence"), "fence": -3_i64, "owner": OWNER, "holder": "h",
        "expiresAt": later, "ttlMs": 60_000_i64 },
        doc! { "_id": format!("{p}owner"), "fence": 1_i64, "owner": 42_i32, "holder": "h",
        "expiresAt": later, "ttlMs": 60_000_i64 },
        doc! { "_id": format!("{p}expiry"), "fence": 1_i64, "owner": OWNER, "holder": "h",
        "expiresAt": DateTime::from_millis(now + 100 * 365 * 86_400_000), "ttlMs": 60_000_i64 },
        doc! { "_id": format!("{p}ctl\n"), "fence": 1_i64, "owner": OWNER, "holder": "h",
        "expiresAt": later, "ttlMs": 60_000_i64 },
        doc! { "_id": format!("{p}grant"), "fence": -3_i64, "owner": OWNER, "holder": "h",
        "expiresAt": DateTime::from_millis(now - 60_000), "ttlMs": 60_000_i64 },
    ];
    backend.collection().insert_many(docs).await.unwrap();
    check_reads(&backend, "mongodb", &p, "the owner is a Int32").await;
    backend.collection().drop().await.unwrap();
}

/// etcd keeps one key per grant (`{prefix}L/{key}\0` = `owner|ttl|holder`
/// on an etcd lease; the fence is the key's create revision, the expiry
/// etcd's): values put by hand that the store cannot read are corrupt,
/// and `force_release` still clears them.
#[cfg(feature = "etcd")]
#[tokio::test]
async fn etcd_reports_corrupt_records() {
    use leasehold::backends::etcd::{EtcdBackend, EtcdOptions};
    use leasehold::etcd_client::PutOptions;

    let Some(url) = leasehold::conformance::server_url("LEASEHOLD_TEST_ETCD") else {
        return;
    };
    let root = format!("corrupt{:08x}/", rand::random::<u32>());
    let backend = EtcdBackend::connect_with(&url, EtcdOptions::new().with_prefix(root.as_str()))
        .await
        .unwrap();
    let mut kv = backend.client().kv_client();
    let lease = backend
        .client()
        .lease_client()
        .grant(60, None)
        .await
        .unwrap()
        .id();
    let on_lease = Some(PutOptions::new().with_lease(lease));
    let p = prefix();
    for (name, value, options) in [
        ("value", "not a grant".to_owned(), on_lease.clone()),
        ("owner", "42|60|h".to_owned(), on_lease.clone()),
        ("ttl", format!("{OWNER}|soon|h"), on_lease.clone()),
        ("nolease", format!("{OWNER}|60|h"), None),
        ("ctl\n", format!("{OWNER}|60|h"), on_lease.clone()),
    ] {
        kv.put(format!("{root}L/{p}{name}\0"), value, options)
            .await
            .unwrap();
    }
    let inspect = |name: &str| {
        let k = key(&format!("{p}{name}"));
        let backend = &backend;
        async move { backend.inspect(&k).await }
    };
    assert_corrupt(inspect("value").await, "etcd", "is not owner|ttl|holder");
    assert_corrupt(inspect("owner").await, "etcd", "is not 32 hex digits");
    assert_corrupt(inspect("ttl").await, "etcd", "is not a number of seconds");
    assert_corrupt(inspect("nolease").await, "etcd", "without an etcd lease");
    let listed = backend.list(&format!("{p}ctl")).await;
    assert_corrupt(
        listed,
        "etcd",
        "the key must not contain control characters",
    );
    // An acquisition that meets one reports it rather than guessing.
    let req = AcquireRequest::new(key(&format!("{p}value")), Duration::from_secs(5), "t").unwrap();
    let granted = backend.try_acquire(&req).await;
    assert_corrupt(
        granted.map(|a| matches!(a, Acquire::Granted(_))),
        "etcd",
        "is not owner|ttl|holder",
    );
    // An administrator can clear them: the one on a lease by revoking it
    // (which takes the others on that lease too), the one without by a
    // delete.
    assert!(backend
        .force_release(&key(&format!("{p}value")))
        .await
        .unwrap());
    assert!(!backend
        .force_release(&key(&format!("{p}nolease")))
        .await
        .unwrap());
    for name in ["value", "owner", "ttl", "nolease"] {
        assert!(inspect(name).await.unwrap().is_none(), "{name} is left");
    }
    let req = AcquireRequest::new(key(&format!("{p}value")), Duration::from_secs(5), "t").unwrap();
    assert!(matches!(
        backend.try_acquire(&req).await.unwrap(),
        Acquire::Granted(_)
    ));
    backend.shutdown().await;
}
