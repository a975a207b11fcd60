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
use leasehold::backends::sqlite::{SqliteBackend, ACQUIRE, RELEASE};
use leasehold::{Acquire, AcquireRequest, Backend, Key, Locks, OwnerId};
use sqlx::SqlitePool;

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
