//! Uncontended acquire + release: leasehold on memory and SQLite, next to the
//! same two SQLite statements issued by hand on the very connection the
//! library uses (the baseline the library is measured against).
//!
//!     cargo bench -p leasehold-benches --bench uncontended
//!
//! Criterion runs one function after the other, and an SQLite file's speed
//! drifts as its WAL grows and checkpoints; the baseline therefore runs both
//! first and last, so the drift is visible. `leasehold bench` interleaves
//! the two instead (A B A B ...).

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use leasehold::backend::{Acquire, AcquireRequest};
use leasehold::backends::sqlite::SqliteBackend;
use leasehold::{Backend, Key, Locks, OwnerId};
use sqlx::SqlitePool;

/// The library's acquire, written out: parameters key, owner hex, holder
/// label, ttl ms; returns the new fence when granted.
const ACQUIRE: &str = "INSERT INTO leasehold_locks (key, fence, owner, holder, expires_at_ms) \
    VALUES (?1, 1, ?2, ?3, CAST(unixepoch('subsec') * 1000 AS INTEGER) + ?4) \
    ON CONFLICT (key) DO UPDATE SET fence = fence + 1, owner = excluded.owner, \
    holder = excluded.holder, expires_at_ms = excluded.expires_at_ms \
    WHERE owner IS NULL OR expires_at_ms <= CAST(unixepoch('subsec') * 1000 AS INTEGER) \
    RETURNING fence";

/// The library's release, written out: parameters key, owner hex, fence.
const RELEASE: &str = "UPDATE leasehold_locks SET owner = NULL, holder = NULL, \
    expires_at_ms = NULL WHERE key = ?1 AND owner = ?2 AND fence = ?3";

/// The library's two statements, by hand.
async fn raw_pair(pool: &SqlitePool) {
    let owner = OwnerId::random().to_string();
    let fence: Option<i64> = sqlx::query_scalar(ACQUIRE)
        .bind("bench-raw")
        .bind(&owner)
        .bind("bench")
        .bind(30_000i64)
        .fetch_optional(pool)
        .await
        .unwrap();
    let fence = fence.expect("uncontended key is free");
    sqlx::query(RELEASE)
        .bind("bench-raw")
        .bind(&owner)
        .bind(fence)
        .execute(pool)
        .await
        .unwrap();
}

fn uncontended(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut group = c.benchmark_group("uncontended acquire+release");
    group.measurement_time(Duration::from_secs(5));

    let backend = rt
        .block_on(SqliteBackend::open(dir.path().join("bench.db")))
        .unwrap();
    let pool = backend.pool().clone();
    let locks = Locks::new(backend.clone());

    group.bench_function("baseline: two sqlite statements by hand", |b| {
        b.to_async(&rt).iter(|| raw_pair(&pool))
    });
    group.bench_function("leasehold sqlite", |b| {
        b.to_async(&rt).iter(|| async {
            let guard = locks.try_acquire("bench").await.unwrap();
            guard.release().await.unwrap();
        })
    });
    let key = Key::new("bench-backend").unwrap();
    group.bench_function("sqlite backend only (no guard)", |b| {
        b.to_async(&rt).iter(|| async {
            let req = AcquireRequest::new(key.clone(), Duration::from_secs(30), "bench").unwrap();
            let Acquire::Granted(lease) = backend.try_acquire(&req).await.unwrap() else {
                panic!("uncontended key is free");
            };
            backend.release(&lease).await.unwrap();
        })
    });
    group.bench_function("baseline again (drift check)", |b| {
        b.to_async(&rt).iter(|| raw_pair(&pool))
    });

    let memory = rt.block_on(Locks::open("memory://")).unwrap();
    group.bench_function("leasehold memory", |b| {
        b.to_async(&rt).iter(|| async {
            let guard = memory.try_acquire("bench").await.unwrap();
            guard.release().await.unwrap();
        })
    });
    group.finish();
}

criterion_group!(benches, uncontended);
criterion_main!(benches);
