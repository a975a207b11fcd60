//! The fence survives a PostgreSQL crash: a throw-away cluster is killed
//! with SIGKILL (postmaster and backends) and restarted, and the next grant
//! still gets a larger token.
//!
//! Needs `initdb` and `pg_ctl` (on PATH or under /usr/lib/postgresql/*/bin);
//! skipped with a notice without them. As root, the cluster runs as the
//! `postgres` user through `runuser` (initdb refuses root).
#![cfg(all(feature = "conformance", feature = "postgres"))]

#[path = "support/private_pg.rs"]
mod private_pg;

use std::time::Duration;

use leasehold::backend::{Acquire, AcquireRequest};
use leasehold::backends::postgres::PostgresBackend;
use leasehold::{Backend, Key, Lease};
use private_pg::{find_bin_dir, is_gone, Cluster};
use tokio::time::{sleep, Instant};

async fn grant(backend: &PostgresBackend, key: &str) -> Lease {
    let req =
        AcquireRequest::new(Key::new(key).unwrap(), Duration::from_secs(60), "crash").unwrap();
    match backend.try_acquire(&req).await.expect("store answers") {
        Acquire::Granted(lease) => lease,
        b => panic!("{key} is not granted: {b:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_survives_a_postgres_crash() {
    let Some(bin) = find_bin_dir() else {
        eprintln!("skipping: initdb/pg_ctl not found on PATH or under /usr/lib/postgresql");
        return;
    };
    let Some(cluster) = Cluster::init(bin) else {
        return;
    };
    let out = cluster.start();
    assert!(
        out.status.success(),
        "pg_ctl start: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let backend = PostgresBackend::connect(&cluster.url()).await.unwrap();
    let released = grant(&backend, "released-before-crash").await;
    backend.release(&released).await.unwrap();
    let held = grant(&backend, "held-at-crash").await;
    drop(backend);

    let pids = cluster.crash();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !pids.iter().all(|p| is_gone(*p)) {
        assert!(Instant::now() < deadline, "killed processes did not exit");
        sleep(Duration::from_millis(50)).await;
    }
    // The old shared memory may take a moment to be let go.
    let mut attempt = 0;
    loop {
        let out = cluster.start();
        if out.status.success() {
            break;
        }
        attempt += 1;
        assert!(
            attempt < 10,
            "restart: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        sleep(Duration::from_millis(500)).await;
    }

    let backend = PostgresBackend::connect(&cluster.url()).await.unwrap();
    let after = grant(&backend, "released-before-crash").await;
    assert!(
        after.token() > released.token(),
        "fence went backwards across the crash: {} then {}",
        released.token(),
        after.token()
    );
    let info = backend
        .inspect(held.key())
        .await
        .unwrap()
        .expect("a lease committed before the crash is still held");
    assert_eq!(info.token, held.token());
    assert!(backend.force_release(held.key()).await.unwrap());
    let next = grant(&backend, "held-at-crash").await;
    assert!(next.token() > held.token() + 1);
}
