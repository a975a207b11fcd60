//! The core's own overhead: uncontended acquire + release on `memory://`,
//! where the store costs next to nothing, so what is measured is the lock
//! engine, the guard and the renewal bookkeeping.
//!
//!     cargo bench -p leasehold-benches --bench uncontended
//!
//! Store figures, side by side with a hand-written baseline on the same
//! store in the same run, come from `leasehold bench` (docs/performance.md).

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use leasehold::Locks;

fn uncontended(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let mut group = c.benchmark_group("uncontended acquire+release");
    group.measurement_time(Duration::from_secs(5));
    let memory = rt
        .block_on(Locks::open("memory://"))
        .expect("memory:// opens");
    group.bench_function("leasehold memory", |b| {
        b.to_async(&rt).iter(|| async {
            let guard = memory.try_acquire("bench").await.expect("a free key");
            guard.release().await.expect("a held key");
        })
    });
    group.finish();
}

criterion_group!(benches, uncontended);
criterion_main!(benches);
