//! What the engine owes a caller that goes away: renewal that does not die
//! with the runtime that happened to start it, and acquisitions dropped
//! while their attempt is at the store that leave no grant behind (a
//! `select!`, a timeout, an HTTP client that disconnects). On the memory
//! store, SQLite, PostgreSQL (`LEASEHOLD_TEST_POSTGRES`) and Redis
//! (`LEASEHOLD_TEST_REDIS`).
#![cfg(all(
    feature = "http",
    feature = "sqlite",
    feature = "postgres",
    feature = "redis"
))]

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use axum::Router;
use leasehold::backend::{Acquire, AcquireRequest, BoxFuture};
use leasehold::backends::decorator::Decorator;
use leasehold::backends::memory::MemoryBackend;
use leasehold::conformance::server_url;
use leasehold::http::{LeaseLayer, Mode};
use leasehold::open::open_backend;
use leasehold::{AcquireOptions, Backend, Locks, Result};
use tower::ServiceExt;

/// A store whose answers to acquisitions come back `delay` after the store
/// executed them, as over a slow link: a caller that goes away meanwhile
/// leaves a grant behind that only the engine can give back.
#[derive(Debug)]
struct SlowReplies {
    inner: Arc<dyn Backend>,
    delay: Duration,
}

impl Decorator for SlowReplies {
    fn inner(&self) -> &dyn Backend {
        self.inner.as_ref()
    }
    fn try_acquire<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Acquire>> {
        Box::pin(async move {
            let answer = self.inner.try_acquire(req).await;
            tokio::time::sleep(self.delay).await;
            answer
        })
    }
}

const STORES: [&str; 4] = ["memory", "sqlite", "postgres", "redis"];

/// The store's backend, opened twice for a URL store (two processes'
/// handles); `None` skips the store.
async fn two_backends(
    store: &str,
    dir: &tempfile::TempDir,
) -> Option<(Arc<dyn Backend>, Arc<dyn Backend>)> {
    let url = match store {
        "memory" => {
            let shared: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
            return Some((shared.clone(), shared));
        }
        "sqlite" => format!("sqlite://{}", dir.path().join("locks.db").display()),
        "postgres" => server_url("LEASEHOLD_TEST_POSTGRES")?,
        "redis" => server_url("LEASEHOLD_TEST_REDIS")?,
        other => unreachable!("{other}"),
    };
    let a = open_backend(&url).await.expect("open the store");
    let b = open_backend(&url).await.expect("open the store again");
    Some((a, b))
}

/// Runs `test` on every store reachable, with a `Locks` whose acquisitions
/// answer 20 ms late ([`SlowReplies`]) and an observer's `Locks` on the same
/// store (another process's handle).
async fn on_every_store<F, Fut>(test: F)
where
    F: Fn(&'static str, Locks, Locks) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for store in STORES {
        let dir = tempfile::tempdir().unwrap();
        let Some((backend, other)) = two_backends(store, &dir).await else {
            continue;
        };
        let locks = Locks::new(SlowReplies {
            inner: backend,
            delay: Duration::from_millis(20),
        });
        test(store, locks, Locks::from_arc(other)).await;
    }
}

fn unique(prefix: &str) -> String {
    format!("{prefix}:{:016x}", rand::random::<u64>())
}

/// Whether somebody holds `key` (a mutex, or a semaphore of `permits`), as
/// another process sees it.
async fn held(observer: &Locks, key: &str, permits: Option<u32>) -> bool {
    match permits {
        None => observer.inspect(key).await.unwrap().is_some(),
        Some(n) => !observer
            .semaphore(key, n)
            .unwrap()
            .holders()
            .await
            .unwrap()
            .is_empty(),
    }
}

/// A guard taken on one runtime keeps renewing, and fires `lost()` when it
/// is lost, after another runtime that used the same `Locks` first has
/// ended. On the memory store: a store whose driver binds its connections
/// to the runtime that opened them (sqlx's pool, for one) fails on its own
/// when that runtime ends, whatever the engine does.
#[test]
fn renewal_outlives_the_runtime_that_started_it() {
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let first = runtime();
    let second = runtime();
    let shared = MemoryBackend::new();
    let locks = Locks::new(shared.clone());
    let observer = Locks::new(shared);
    let key = unique("two-runtimes");
    // The first runtime schedules the handle's first renewal.
    first.block_on(async {
        let early = locks.try_acquire(&unique("early")).await.unwrap();
        early.release().await.unwrap();
    });
    let ttl = Duration::from_secs(1);
    let guard = second.block_on(async {
        locks
            .acquire_with(&key, &AcquireOptions::new().with_ttl(ttl))
            .await
            .unwrap()
    });
    drop(first);
    second.block_on(async {
        tokio::time::sleep(ttl * 3).await;
        assert!(!guard.is_lost(), "the guard stopped renewing");
        let held = observer.inspect(&key).await.unwrap().expect("still held");
        assert_eq!(held.token, guard.token());
        // Broken behind its back: the next renewal finds out.
        assert!(observer.force_release(&key).await.unwrap());
        tokio::time::timeout(ttl * 5, guard.lost())
            .await
            .expect("lost() fired");
    });
}

/// Acquisitions dropped after 1–6 ms, while the store's answer (20 ms away)
/// is on its way, leave no mutex or permit held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_acquisition_leaves_no_grant() {
    on_every_store(|store, locks, observer| async move {
        let options = AcquireOptions::new().with_ttl(Duration::from_secs(30));
        let mut keys = Vec::new();
        for i in 0..12u64 {
            let patience = Duration::from_millis(1 + i % 6);
            let key = unique("dropped");
            let permits = (i % 2 == 1).then_some(2);
            let outcome = match permits {
                None => tokio::time::timeout(patience, locks.acquire_with(&key, &options)).await,
                Some(n) => {
                    let semaphore = locks.semaphore(&key, n).unwrap();
                    tokio::time::timeout(patience, semaphore.acquire_with(&options)).await
                }
            };
            assert!(outcome.is_err(), "{store}: answered within {patience:?}");
            keys.push((key, permits));
        }
        // Given back in the background: free well within the ttl (30 s).
        let give_up = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let mut still = Vec::new();
            for (key, permits) in &keys {
                if held(&observer, key, *permits).await {
                    still.push(key.clone());
                }
            }
            if still.is_empty() {
                break;
            }
            assert!(
                tokio::time::Instant::now() < give_up,
                "{store}: held with no guard: {still:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

/// A permit-limited route whose clients disconnect while their attempt is
/// at the store, and while they wait behind requests that hold the permits:
/// afterwards a request is let through at once, not refused for a ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnected_clients_leave_the_permits_free() {
    on_every_store(|store, locks, _| async move {
        let key = unique("route");
        let (entered_tx, mut entered) = tokio::sync::mpsc::unbounded_channel();
        let finish = Arc::new(tokio::sync::Semaphore::new(0));
        let hold = finish.clone();
        let layer = LeaseLayer::builder(locks)
            .with_ttl(Duration::from_secs(30))
            .with_mode(Mode::Wait(Duration::from_millis(500)))
            .with_permits(2)
            .with_store_timeout(Duration::from_secs(5))
            .with_key(move |_: &Request<Body>| Some(key.clone()))
            .build()
            .unwrap();
        let router = Router::new()
            .route("/work", post(|| async { "done" }))
            .route(
                "/hold",
                post(move || async move {
                    let _ = entered_tx.send(());
                    let _ = hold.acquire().await;
                    "held"
                }),
            )
            .layer(layer);
        let call = |path: &str| {
            router
                .clone()
                .oneshot(Request::post(path).body(Body::empty()).unwrap())
        };
        // Disconnects while the attempt is at the store.
        for i in 0..10u64 {
            let patience = Duration::from_millis(1 + i % 6);
            assert!(tokio::time::timeout(patience, call("/work")).await.is_err());
        }
        // Disconnects while waiting behind two requests that hold both
        // permits (some also while an attempt is in flight).
        let holders: Vec<_> = (0..2).map(|_| tokio::spawn(call("/hold"))).collect();
        for _ in 0..2 {
            // Refused (permits still taken), a holder never enters.
            tokio::time::timeout(Duration::from_secs(10), entered.recv())
                .await
                .unwrap_or_else(|_| panic!("{store}: the permits were not free for new requests"))
                .unwrap();
        }
        for i in 0..10u64 {
            let patience = Duration::from_millis(1 + 5 * i);
            assert!(tokio::time::timeout(patience, call("/work")).await.is_err());
        }
        finish.add_permits(2);
        for holder in holders {
            let response = holder.await.unwrap().unwrap();
            assert_eq!(response.status(), StatusCode::OK, "{store}");
            axum::body::to_bytes(response.into_body(), 1024)
                .await
                .unwrap();
        }
        // The grants of the disconnected clients are given back in the
        // background; the next request waits for this handle's own.
        let response = call("/work").await.unwrap();
        assert_eq!(
            response.status(),
            StatusCode::OK,
            "{store}: a request after the disconnects was refused"
        );
    })
    .await;
}

/// An acquisition dropped while its attempt waits on a timer of the
/// caller's runtime, which then shuts down: the attempt ends with that
/// runtime, and no thread panics ("A Tokio 1.x context was found, but it
/// is being shutdown") polling it elsewhere.
#[test]
fn an_attempt_left_on_a_runtime_that_ends_panics_nowhere() {
    let timer_panics = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let previous = std::panic::take_hook();
    let counted = timer_panics.clone();
    std::panic::set_hook(Box::new(move |info| {
        if info.to_string().contains("Tokio 1.x context") {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        previous(info);
    }));
    let slow: Arc<dyn Backend> = Arc::new(SlowReplies {
        inner: Arc::new(MemoryBackend::new()),
        delay: Duration::from_millis(300),
    });
    let locks = Locks::from_arc(slow);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let options = AcquireOptions::new().with_wait(Duration::from_secs(5));
        let outcome =
            tokio::time::timeout(Duration::from_millis(50), locks.acquire_with("k", &options))
                .await;
        assert!(outcome.is_err(), "answered before the store's delay");
    });
    drop(runtime);
    // Past the store's delay: the attempt would be polled by now.
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(
        timer_panics.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "a thread panicked polling a timer of a runtime that had ended"
    );
}
