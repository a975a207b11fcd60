//! The lease layer over real HTTP, on a SQLite store: release after a panic
//! and after a disconnect, a disconnect stops a wait, store outages are 503,
//! and a handler slower than the ttl keeps its lease.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::routing::post;
use axum::Router;
use http::Request;
use leasehold::http::{LeaseLayer, Mode};
use leasehold::testing::{Fault, Op};
use leasehold::Locks;
use reqwest::{header, StatusCode};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, Notify};
use tower_http::catch_panic::CatchPanicLayer;

const KEY: &str = "resource";

/// Every POST locks `KEY`; GETs take no lock.
fn layer(locks: Locks, ttl: Duration, mode: Mode) -> LeaseLayer<Body> {
    LeaseLayer::builder(locks)
        .with_ttl(ttl)
        .with_mode(mode)
        .with_store_timeout(Duration::from_millis(300))
        .with_key(|req: &Request<Body>| {
            (req.method() == http::Method::POST).then(|| KEY.to_owned())
        })
        .build()
        .unwrap()
}

/// Routes for the tests: `/ok` counts its calls; `/stuck` reports entry on
/// `entered` and then waits for `finish` (forever if never notified);
/// `/panic` panics.
struct Routes {
    ok_calls: Arc<AtomicUsize>,
    entered: mpsc::UnboundedReceiver<()>,
    finish: Arc<Notify>,
    router: Router,
}

fn routes() -> Routes {
    let ok_calls = Arc::new(AtomicUsize::new(0));
    let (entered_tx, entered) = mpsc::unbounded_channel();
    let finish = Arc::new(Notify::new());
    let calls = ok_calls.clone();
    let wait_for = finish.clone();
    let router = Router::new()
        .route(
            "/ok",
            post(move || async move {
                calls.fetch_add(1, Ordering::SeqCst);
                "ok"
            }),
        )
        .route(
            "/stuck",
            post(move || async move {
                let _ = entered_tx.send(());
                wait_for.notified().await;
                "finished"
            }),
        )
        .route("/panic", post(panicking));
    Routes {
        ok_calls,
        entered,
        finish,
        router,
    }
}

async fn panicking() -> &'static str {
    panic!("handler bug")
}

/// Sends a POST on a raw connection that the test can drop mid-request, as
/// a client that goes away does.
async fn raw_post(base: &str, path: &str) -> tokio::net::TcpStream {
    let addr = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    stream
}

async fn held(locks: &Locks) -> bool {
    locks.inspect(KEY).await.unwrap().is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_leaves_the_lock_free() {
    let dir = tempfile::tempdir().unwrap();
    let locks = common::locks(&common::sqlite_store(&dir).await);
    // The ttl is far longer than the test: only a release frees the lock.
    let lease = layer(locks.clone(), Duration::from_secs(600), Mode::Reject);
    let caught = routes()
        .router
        .layer(lease.clone())
        .layer(CatchPanicLayer::new());
    let uncaught = routes().router.layer(lease);
    for (router, caught) in [(caught, true), (uncaught, false)] {
        let (base, _server) = common::serve(router).await;
        let client = common::client();
        let response = client.post(format!("{base}/panic")).send().await;
        if caught {
            assert_eq!(
                response.unwrap().status(),
                StatusCode::INTERNAL_SERVER_ERROR
            );
        } else {
            // The connection task unwinds: the client sees the connection close.
            assert!(response.is_err());
        }
        let next = common::first_non_409(&client, &format!("{base}/ok")).await;
        assert_eq!(next, StatusCode::OK, "caught: {caught}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_handler_leaves_the_lock_free() {
    let dir = tempfile::tempdir().unwrap();
    let locks = common::locks(&common::sqlite_store(&dir).await);
    let mut routes = routes();
    let lease = layer(locks.clone(), Duration::from_secs(600), Mode::Reject);
    let (base, _server) = common::serve(routes.router.layer(lease)).await;
    let stream = raw_post(&base, "/stuck").await;
    routes.entered.recv().await.unwrap();
    assert!(held(&locks).await, "held while the handler runs");
    drop(stream);
    let next = common::first_non_409(&common::client(), &format!("{base}/ok")).await;
    assert_eq!(next, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_while_waiting_stops_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::sqlite_store(&dir).await;
    let locks = common::locks(&store);
    let routes = routes();
    let lease = layer(
        locks.clone(),
        Duration::from_secs(600),
        Mode::Wait(Duration::from_secs(600)),
    );
    let (base, _server) = common::serve(routes.router.layer(lease)).await;

    let holder = locks.try_acquire(KEY).await.unwrap();
    let subscribed = store.calls(Op::Subscribe);
    let waiter = raw_post(&base, "/ok").await;
    // The request is waiting once it subscribed to release notifications.
    while store.calls(Op::Subscribe) == subscribed {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(waiter);
    // Let the server see the disconnect, then free the lock: a waiter still
    // alive would try again at once (woken by the release), take the lock
    // and call the handler. Seeing the disconnect takes the server
    // microseconds; the second is slack for a loaded machine.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let attempts = store.calls(Op::TryAcquire);
    holder.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        store.calls(Op::TryAcquire),
        attempts,
        "no attempt after the disconnect"
    );
    assert_eq!(routes.ok_calls.load(Ordering::SeqCst), 0);
    assert!(!held(&locks).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_outages_are_503_problems_and_never_hang() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::sqlite_store(&dir).await;
    let routes = routes();
    for mode in [Mode::Reject, Mode::Wait(Duration::from_secs(1))] {
        let lease = layer(common::locks(&store), Duration::from_secs(10), mode);
        let (base, _server) = common::serve(routes.router.clone().layer(lease)).await;
        let client = common::client();
        for outage in [Fault::Unavailable("injected outage".into()), Fault::Hang] {
            store.set_all(outage);
            let response = client.post(format!("{base}/ok")).send().await.unwrap();
            assert_eq!(response.headers()[header::RETRY_AFTER], "1");
            let doc = common::problem(response, StatusCode::SERVICE_UNAVAILABLE).await;
            assert_eq!(doc["type"], leasehold::http::problem::STORE_UNAVAILABLE);
            assert_eq!(doc["key"], KEY);
            // The driver's error text stays in the server's log.
            assert!(!doc.to_string().contains("injected"), "{doc}");
            store.recover();
        }
        let ok = client.post(format!("{base}/ok")).send().await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
    }
    assert_eq!(routes.ok_calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_slower_than_the_ttl_keeps_its_lease() {
    let dir = tempfile::tempdir().unwrap();
    let locks = common::locks(&common::sqlite_store(&dir).await);
    let mut routes = routes();
    // 1 s: renewal every ttl/3 keeps it with room for a loaded machine (at
    // 300 ms a CI run under full load once let a probe see no 409).
    let ttl = Duration::from_secs(1);
    let (base, _server) = common::serve(routes.router.layer(layer(locks, ttl, Mode::Reject))).await;
    let client = common::client();

    let slow = tokio::spawn(client.post(format!("{base}/stuck")).send());
    routes.entered.recv().await.unwrap();
    // Probe for five ttls: without renewal the lease would expire after one
    // and a probe would get in.
    let probing_until = tokio::time::Instant::now() + 5 * ttl;
    let mut probes = 0;
    while tokio::time::Instant::now() < probing_until {
        let probe = client.post(format!("{base}/ok")).send().await.unwrap();
        common::locked(probe, KEY).await;
        probes += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        routes.ok_calls.load(Ordering::SeqCst),
        0,
        "nobody else entered"
    );
    routes.finish.notify_one();
    let slow = slow.await.unwrap().unwrap();
    assert_eq!(slow.status(), StatusCode::OK);
    assert_eq!(slow.text().await.unwrap(), "finished");
    // Released with the response: the next request gets in at once.
    let after = client.post(format!("{base}/ok")).send().await.unwrap();
    assert_eq!(after.status(), StatusCode::OK, "after {probes} probes");
}
