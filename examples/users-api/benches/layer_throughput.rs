//! Requests/s through the lease layer on uncontended keys, against the same
//! route without the layer, over real HTTP on loopback.
//!
//! `cargo bench -p users-api --bench layer_throughput`
//! (`BENCH_SECS`, default 3, and `BENCH_CLIENTS`, default 8, to change the
//! run). Each client posts to its own key, so nobody waits for a lock: the
//! numbers are the cost of acquire + release on the store per request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::routing::post;
use axum::Router;
use http::Request;
use leasehold::http::LeaseLayer;
use leasehold::Locks;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    format!("http://{addr}")
}

fn router(locks: Option<Locks>) -> Router {
    let router = Router::new().route("/bench/{client}", post(|| async { "ok" }));
    match locks {
        None => router,
        Some(locks) => router.layer(
            LeaseLayer::builder(locks)
                .with_ttl(Duration::from_secs(10))
                .with_key(|req: &Request<Body>| Some(req.uri().path().to_owned()))
                .build()
                .unwrap(),
        ),
    }
}

/// Requests/s and mean latency of `clients` clients posting for `secs`.
async fn run(base: &str, clients: u64, secs: u64) -> (f64, Duration) {
    let done = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs(secs);
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let url = format!("{base}/bench/{c}");
            let done = done.clone();
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                while Instant::now() < until {
                    let response = client.post(&url).send().await.unwrap();
                    assert!(response.status().is_success(), "{}", response.status());
                    response.bytes().await.unwrap();
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = started.elapsed();
    let n = done.load(Ordering::Relaxed);
    (
        n as f64 / elapsed.as_secs_f64(),
        elapsed * clients as u32 / n.max(1) as u32,
    )
}

#[tokio::main]
async fn main() {
    let secs = env("BENCH_SECS", 3);
    let clients = env("BENCH_CLIENTS", 8);
    let dir = tempfile::tempdir().unwrap();
    let sqlite = format!("sqlite://{}", dir.path().join("locks.db").display());
    println!("{clients} clients, {secs} s each, uncontended keys, HTTP/1.1 on loopback");
    println!("{:<28} {:>10} {:>12}", "route", "req/s", "mean latency");
    let cases: [(&str, Option<&str>); 3] = [
        ("without the layer", None),
        ("layer, memory://", Some("memory://")),
        ("layer, sqlite://", Some(&sqlite)),
    ];
    for (name, store) in cases {
        let locks = match store {
            Some(url) => Some(Locks::open(url).await.unwrap()),
            None => None,
        };
        let base = serve(router(locks)).await;
        run(&base, clients, 1).await; // warm up connections and the store
        let (rate, latency) = run(&base, clients, secs).await;
        println!("{name:<28} {rate:>10.0} {latency:>12.2?}");
    }
}
