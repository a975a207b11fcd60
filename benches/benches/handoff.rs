//! Hand-off latency on SQLite: how long after a holder's release a waiter
//! (another `Locks` on the same file, with its own connection and wake
//! socket, as in another process) holds the lock. Woken by the wake
//! directory, next to the same waiter polling only (no notifications).
//!
//!     cargo bench -p leasehold-benches --bench handoff
//!
//! Also reports one uncontended acquire for scale.

use std::sync::Arc;
use std::time::Duration;

use leasehold::backends::polling::PollingOnly;
use leasehold::backends::sqlite::SqliteBackend;
use leasehold::Locks;
use tokio::time::Instant;

const ROUNDS: usize = 200;

async fn handoffs(holder: &Locks, waiter: &Locks) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let guard = holder.try_acquire("handoff").await.unwrap();
        let w = waiter.clone();
        let task = tokio::spawn(async move {
            let g = w.acquire("handoff", Duration::from_secs(30)).await.unwrap();
            let at = Instant::now();
            g.release().await.unwrap();
            at
        });
        // Let the waiter find the key busy and go to sleep.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let released = Instant::now();
        guard.release().await.unwrap();
        let acquired = task.await.unwrap();
        samples.push(acquired - released);
    }
    samples.sort();
    samples
}

fn pct(sorted: &[Duration], q: f64) -> Duration {
    sorted[((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // cargo bench --list
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("handoff.db");
    let holder = Locks::new(SqliteBackend::open(&path).await.unwrap());
    let notified = Locks::new(SqliteBackend::open(&path).await.unwrap());
    let polling = Locks::from_arc(Arc::new(PollingOnly(
        SqliteBackend::open(&path).await.unwrap(),
    )));

    let mut uncontended = Vec::new();
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let g = holder.try_acquire("single").await.unwrap();
        uncontended.push(t.elapsed());
        g.release().await.unwrap();
    }
    uncontended.sort();
    let woken = handoffs(&holder, &notified).await;
    let polled = handoffs(&holder, &polling).await;
    println!("sqlite hand-off, {ROUNDS} rounds each (release -> next holder acquired)");
    println!("{:<28} {:>12} {:>12}", "", "p50", "p99");
    for (name, s) in [
        ("one uncontended acquire", &uncontended),
        ("hand-off, woken (datagram)", &woken),
        ("hand-off, polling only", &polled),
    ] {
        println!("{name:<28} {:>12?} {:>12?}", pct(s, 0.5), pct(s, 0.99));
    }
}
