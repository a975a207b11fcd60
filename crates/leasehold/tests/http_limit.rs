//! The lease layer as a concurrency limit (`with_permits`) across two
//! "processes": two `Locks` with their own clients on one store, each
//! serving the same router. On the memory store, SQLite, PostgreSQL
//! (`LEASEHOLD_TEST_POSTGRES`) and Redis (`LEASEHOLD_TEST_REDIS`).
#![cfg(all(
    feature = "http",
    feature = "sqlite",
    feature = "postgres",
    feature = "redis"
))]

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::routing::post;
use axum::Router;
use leasehold::backends::memory::MemoryBackend;
use leasehold::conformance::server_url;
use leasehold::http::{problem, LeaseLayer, LimitStatus, Mode};
use leasehold::Locks;
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;
use tower::ServiceExt;

const PERMITS: u32 = 2;
const TTL: Duration = Duration::from_secs(10);

/// Two `Locks` on one store, as two processes have, a fresh limit key,
/// and the directory a file store lives in (kept while it is);
/// `None` skips the store.
async fn two_processes(store: &str) -> Option<(Locks, Locks, String, tempfile::TempDir)> {
    let dir = tempfile::tempdir().unwrap();
    let key = format!("limit:{:016x}", rand::random::<u64>());
    let url = match store {
        "memory" => {
            let shared = MemoryBackend::new();
            return Some((Locks::new(shared.clone()), Locks::new(shared), key, dir));
        }
        "sqlite" => format!("sqlite://{}", dir.path().join("locks.db").display()),
        "postgres" => server_url("LEASEHOLD_TEST_POSTGRES")?,
        "redis" => server_url("LEASEHOLD_TEST_REDIS")?,
        other => unreachable!("{other}"),
    };
    let a = Locks::open(&url).await.expect("open the store");
    let b = Locks::open(&url).await.expect("open the store again");
    Some((a, b, key, dir))
}

const STORES: [&str; 4] = ["memory", "sqlite", "postgres", "redis"];

/// A process's app: `/work` reports entry on `entered`, then waits for
/// `finish`. Every POST takes one of `PERMITS` permits of `key`.
struct App {
    router: Router,
    entered: mpsc::UnboundedReceiver<()>,
}

fn app(locks: Locks, key: &str, mode: Mode, status: LimitStatus, finish: Arc<Notify>) -> App {
    let (entered_tx, entered) = mpsc::unbounded_channel();
    let key = key.to_owned();
    let layer = LeaseLayer::builder(locks)
        .with_ttl(TTL)
        .with_mode(mode)
        .with_permits(PERMITS)
        .with_limit_status(status)
        .with_store_timeout(Duration::from_secs(2))
        .with_key(move |_: &Request<Body>| Some(key.clone()))
        .build()
        .unwrap();
    let router = Router::new()
        .route(
            "/work",
            post(move || async move {
                let _ = entered_tx.send(());
                finish.notified().await;
                "done"
            }),
        )
        .layer(layer);
    App { router, entered }
}

fn send(router: &Router) -> JoinHandle<axum::response::Response> {
    let request = Request::post("/work").body(Body::empty()).unwrap();
    let router = router.clone();
    tokio::spawn(async move { router.oneshot(request).await.unwrap() })
}

/// Reads the body of a refused request and checks it against its headers.
async fn refused(response: axum::response::Response, status: StatusCode, key: &str) {
    assert_eq!(response.status(), status);
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        problem::CONTENT_TYPE
    );
    let retry_after: u64 = response.headers()[header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let body = axum::body::to_bytes(response.into_body(), 4096)
        .await
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(doc["type"], problem::LIMITED);
    assert_eq!(doc["status"], status.as_u16());
    assert_eq!(doc["key"], key);
    // The first permit's remaining time, which the header rounds up.
    let ms = doc["retry_after_ms"].as_u64().unwrap();
    assert!(
        ms > 0 && ms <= TTL.as_millis() as u64,
        "retry_after_ms {ms}"
    );
    assert_eq!(
        retry_after,
        ms.div_ceil(1000).max(1),
        "Retry-After of {ms} ms"
    );
}

#[tokio::test]
async fn n_permits_admit_n_requests_across_processes_and_refuse_the_next() {
    for store in STORES {
        let Some((a, b, key, _dir)) = two_processes(store).await else {
            continue;
        };
        for (status, expected) in [
            (
                LimitStatus::ServiceUnavailable,
                StatusCode::SERVICE_UNAVAILABLE,
            ),
            (LimitStatus::TooManyRequests, StatusCode::TOO_MANY_REQUESTS),
        ] {
            let finish = Arc::new(Notify::new());
            let mut app_a = app(a.clone(), &key, Mode::Reject, status, finish.clone());
            let mut app_b = app(b.clone(), &key, Mode::Reject, status, finish.clone());
            // One request in flight in each process: both permits taken.
            let first = send(&app_a.router);
            app_a.entered.recv().await.unwrap();
            let second = send(&app_b.router);
            app_b.entered.recv().await.unwrap();
            // The third, in either process, is refused without running.
            for router in [&app_a.router, &app_b.router] {
                refused(send(router).await.unwrap(), expected, &key).await;
            }
            assert!(app_a.entered.try_recv().is_err() && app_b.entered.try_recv().is_err());
            // Both finish; their permits come back and a new request runs.
            finish.notify_waiters();
            for done in [first, second] {
                let response = done.await.unwrap();
                assert_eq!(response.status(), StatusCode::OK, "{store}");
                axum::body::to_bytes(response.into_body(), 64)
                    .await
                    .unwrap();
            }
            // The bodies are sent; their releases run on tasks of their own.
            eventually_free(&a, &key, store).await;
            let again = send(&app_b.router);
            app_b.entered.recv().await.unwrap();
            finish.notify_waiters();
            assert_eq!(again.await.unwrap().status(), StatusCode::OK, "{store}");
            eventually_free(&a, &key, store).await;
        }
    }
}

#[tokio::test]
async fn a_waiting_request_gets_the_permit_another_process_releases() {
    for store in STORES {
        let Some((a, b, key, _dir)) = two_processes(store).await else {
            continue;
        };
        let status = LimitStatus::ServiceUnavailable;
        let finish_a = Arc::new(Notify::new());
        let finish_b = Arc::new(Notify::new());
        let wait = Mode::Wait(Duration::from_secs(5));
        let mut app_a = app(a.clone(), &key, wait, status, finish_a.clone());
        let mut app_b = app(b.clone(), &key, wait, status, finish_b.clone());
        let held = [send(&app_a.router), send(&app_a.router)];
        app_a.entered.recv().await.unwrap();
        app_a.entered.recv().await.unwrap();
        // Process B waits for a permit of A's...
        let waiting = send(&app_b.router);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(app_b.entered.try_recv().is_err(), "{store}: no permit yet");
        // ...and gets one when A's requests finish.
        finish_a.notify_waiters();
        for done in held {
            assert_eq!(done.await.unwrap().status(), StatusCode::OK);
        }
        tokio::time::timeout(Duration::from_secs(4), app_b.entered.recv())
            .await
            .unwrap_or_else(|_| panic!("{store}: the waiter never got the permit"));
        finish_b.notify_waiters();
        assert_eq!(waiting.await.unwrap().status(), StatusCode::OK);
        // A wait that ends without a permit is refused as Reject is.
        let mut app_a = app(a.clone(), &key, wait, status, finish_a.clone());
        let short = Mode::Wait(Duration::from_millis(300));
        let app_b = app(
            b.clone(),
            &key,
            short,
            LimitStatus::TooManyRequests,
            finish_b,
        );
        let held = [send(&app_a.router), send(&app_a.router)];
        app_a.entered.recv().await.unwrap();
        app_a.entered.recv().await.unwrap();
        refused(
            send(&app_b.router).await.unwrap(),
            StatusCode::TOO_MANY_REQUESTS,
            &key,
        )
        .await;
        finish_a.notify_waiters();
        for done in held {
            assert_eq!(done.await.unwrap().status(), StatusCode::OK);
        }
        eventually_free(&a, &key, store).await;
    }
}

/// Releases run on background tasks: wait (bounded) until no permit of
/// `key` is live.
async fn eventually_free(locks: &Locks, key: &str, store: &str) {
    let semaphore = locks.semaphore(key, PERMITS).unwrap();
    for _ in 0..100 {
        if semaphore.holders().await.unwrap().is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "{store}: permits of {key} still held: {:?}",
        semaphore.holders().await
    );
}
