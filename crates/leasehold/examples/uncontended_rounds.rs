//! Times uncontended acquire + release rounds on one store, so that two
//! builds of the crate can be compared as whole processes: the `metrics`
//! feature off against the feature on with no recorder installed.
//!
//! ```sh
//! cargo build --release -p leasehold --example uncontended_rounds
//! cp target/release/examples/uncontended_rounds /tmp/rounds-off
//! cargo build --release -p leasehold --features metrics --example uncontended_rounds
//! cp target/release/examples/uncontended_rounds /tmp/rounds-on
//! /tmp/rounds-off 200000 & /tmp/rounds-on 200000   # or side by side, in turn
//! ```
//!
//! Arguments: the number of rounds (default 100000) and a store URL
//! (default `memory://`). Prints the p50 and p99 of one round and whether
//! the `metrics` feature was compiled in.

use std::time::{Duration, Instant};

use leasehold::Locks;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let rounds: usize = match args.next() {
        Some(n) => n
            .parse()
            .map_err(|e| format!("rounds must be a positive whole number, got {n:?}: {e}"))?,
        None => 100_000,
    };
    if rounds == 0 {
        return Err("rounds must be at least 1".into());
    }
    let url = args.next().unwrap_or_else(|| "memory://".to_owned());
    let locks = Locks::open(&url).await?;
    let ttl = Duration::from_secs(10);
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        let guard = locks.acquire("bench:uncontended", ttl).await?;
        guard.release().await?;
        samples.push(start.elapsed());
    }
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    println!(
        "{rounds} rounds on {}: p50 {:.2} µs, p99 {:.2} µs (metrics feature {})",
        url.split("://").next().unwrap_or("?"),
        at(0.50).as_secs_f64() * 1e6,
        at(0.99).as_secs_f64() * 1e6,
        if cfg!(feature = "metrics") {
            "on, no recorder"
        } else {
            "off"
        }
    );
    locks.close().await;
    Ok(())
}
