//! Storage bounded by the keys in use, measured on SQLite: acquires and
//! releases many distinct keys once each (a lock per order), counts the
//! rows, then keeps one other key busy until the sweep has passed and
//! counts again; finally re-acquires a sample of the keys and checks that
//! each token is above the one the key had before its record was deleted.
//!
//! ```sh
//! cargo run --release -p leasehold --example idle_keys -- 100000 2s
//! ```
//!
//! Arguments: the number of keys (default 100000) and the idle window
//! (default 2s; `ms`, `s`, `m` or `h`).

use std::time::{Duration, Instant};

use leasehold::backends::sqlite::{SqliteBackend, SqliteOptions};
use leasehold::Locks;

async fn rows(backend: &SqliteBackend) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT count(*) FROM leasehold_locks")
        .fetch_one(backend.pool())
        .await
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let keys: usize = match args.next() {
        Some(n) => n
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("keys must be a positive whole number, got {n:?}"))?,
        None => 100_000,
    };
    let window = leasehold::backend::parse_idle_window(&args.next().unwrap_or("2s".into()))?
        .ok_or("the idle window must be a duration here, not never")?;
    let dir = tempfile::tempdir()?;
    let backend = SqliteBackend::open_with(
        dir.path().join("locks.db"),
        SqliteOptions::new().with_idle_window(Some(window)),
    )
    .await?;
    let locks = Locks::new(backend.clone());
    let ttl = Duration::from_secs(30);

    let start = Instant::now();
    let mut sample = Vec::new();
    for i in 0..keys {
        let guard = locks.acquire(&format!("order/{i}"), ttl).await?;
        if i % (keys / 100).max(1) == 0 {
            sample.push((i, guard.token()));
        }
        guard.release().await?;
    }
    let took = start.elapsed();
    println!(
        "{keys} keys acquired and released once in {:.1} s: {} rows",
        took.as_secs_f64(),
        rows(&backend).await?
    );

    let idle_from = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        locks.acquire("tick", ttl).await?.release().await?;
        let left = rows(&backend).await?;
        if left <= 1 {
            println!(
                "{left} row left {:.1} s after the last release (idle window {window:?})",
                idle_from.elapsed().as_secs_f64()
            );
            break;
        }
        if idle_from.elapsed() > window * 4 + Duration::from_secs(60) {
            return Err(format!("{left} rows still there").into());
        }
    }

    let mut lower = 0;
    for (i, before) in &sample {
        let guard = locks.acquire(&format!("order/{i}"), ttl).await?;
        if guard.token() <= *before {
            lower += 1;
        }
        guard.release().await?;
    }
    println!(
        "{} sampled keys re-acquired: {lower} with a token at or below their earlier one",
        sample.len()
    );
    locks.close().await;
    if lower > 0 {
        return Err("tokens went backwards".into());
    }
    Ok(())
}
