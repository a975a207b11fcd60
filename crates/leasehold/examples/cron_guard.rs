//! A cron job that must not run twice at once, on any store.
//!
//! ```sh
//! cargo run -p leasehold --example cron_guard                      # SQLite in a temp dir
//! LOCKS_URL=postgres://postgres@127.0.0.1/test \
//!   cargo run -p leasehold --features postgres --example cron_guard
//! LOCKS_URL=redis://127.0.0.1:6379 cargo run -p leasehold --features redis --example cron_guard
//! ```
//!
//! Three runs show the three outcomes a job guard has to handle:
//! 1. nobody else runs the job: it runs to the end and releases the lock;
//! 2. another host is running it: this one skips, naming the holder;
//! 3. the lease is lost mid-job (here an admin's `force_release`; in real
//!    life also a pause or a store outage longer than the ttl): the job
//!    stops at once, before its next write.

use std::time::Duration;

use leasehold::{AcquireOptions, Error, LeaseGuard, Locks};

/// How one run of the job ended.
#[derive(Debug, PartialEq)]
enum Outcome {
    Done { batches: u32 },
    Skipped,
    Stopped { after_batches: u32 },
}

const KEY: &str = "cron:nightly-report";
const BATCHES: u32 = 12;

#[tokio::main]
async fn main() -> Result<(), leasehold::BoxError> {
    // A temporary SQLite file unless LOCKS_URL names another store.
    let dir = tempfile::tempdir()?;
    let url = std::env::var("LOCKS_URL")
        .unwrap_or_else(|_| format!("sqlite://{}/locks.db", dir.path().display()));
    let locks = Locks::open(&url).await?;
    // A key left over from an interrupted run of this example.
    locks.force_release(KEY).await?;

    // 1. Alone: the job runs to the end.
    let outcome = run_job(&locks, |_| async {}).await?;
    println!("first run: {outcome:?}");
    assert_eq!(outcome, Outcome::Done { batches: BATCHES });

    // 2. Another host holds the lock: skip, do not wait. (A second handle
    //    on the same store stands in for the other host.)
    let other_host = Locks::open(&url).await?.try_acquire(KEY).await?;
    let outcome = run_job(&locks, |_| async {}).await?;
    println!("while another host runs it: {outcome:?}");
    assert_eq!(outcome, Outcome::Skipped);
    other_host.release().await?;

    // 3. An admin breaks the lock after the third batch. The guard learns
    //    it at its next renewal (ttl/3 later at most) and `lost()` resolves.
    let admin = Locks::open(&url).await?;
    let admin_in_job = admin.clone();
    let outcome = run_job(&locks, move |batch| {
        let admin = admin_in_job.clone();
        async move {
            if batch == 3 {
                admin.force_release(KEY).await.expect("force release");
            }
        }
    })
    .await?;
    println!("lock broken mid-job: {outcome:?}");
    assert!(matches!(outcome, Outcome::Stopped { after_batches } if after_batches < BATCHES));

    // The program ends here: close the connections before the runtime
    // stops (the MongoDB driver needs it; the other stores do not mind).
    admin.close().await;
    locks.close().await;
    Ok(())
}

/// The guarded job: take the lock without waiting, then do the work in
/// batches, stopping as soon as the lease is lost. `after_batch` lets the
/// example interfere after a given batch.
async fn run_job<F, Fut>(locks: &Locks, after_batch: F) -> leasehold::Result<Outcome>
where
    F: Fn(u32) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    // A short ttl so the example's lost lease shows quickly; a real job
    // would take the default 30 s (renewed every 10 s while it runs).
    let options = AcquireOptions::new().with_ttl(Duration::from_secs(2));
    let guard = match locks.acquire_with(KEY, &options).await {
        Ok(guard) => guard,
        Err(busy @ Error::Busy { .. }) => {
            // lock "cron:nightly-report" is held by HOST:PID for up to 29.99s more
            println!("  {busy}; skipping");
            return Ok(Outcome::Skipped);
        }
        Err(e) => return Err(e),
    };
    println!("  running with fencing token {}", guard.token());

    let mut batches = 0;
    while batches < BATCHES {
        // Race each batch against the lost-lease signal: once it fires,
        // another process may hold the lock, so write nothing more.
        tokio::select! {
            _ = guard.lost() => {
                println!("  lease lost after {batches} batches; stopping");
                return Ok(Outcome::Stopped { after_batches: batches });
            }
            () = one_batch(&guard) => batches += 1,
        }
        after_batch(batches).await;
    }
    guard.release().await?;
    Ok(Outcome::Done { batches })
}

/// One unit of work. Writes it makes should carry `guard.token()` to a
/// resource that refuses older tokens (see `postgres_fenced_write.rs`).
async fn one_batch(guard: &LeaseGuard) {
    let _fencing_token = guard.token();
    tokio::time::sleep(Duration::from_millis(150)).await;
}
