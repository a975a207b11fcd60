//! The layer in-process, on paused time where timing matters. The same
//! behaviour over real HTTP is tested in `examples/users-api/tests`.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ::http::{header, Request, Response, StatusCode};
use tokio::runtime::Handle;
use tower::{Layer, Service, ServiceExt};

use super::body::collect;
use super::{problem, FencingToken, LeaseLayer, LeaseLayerBuilder, Mode};
use crate::backends::memory::MemoryBackend;
use crate::lock::Locks;
use crate::testing::{Fault, Faulty};

type Req = Request<String>;

/// Locks `/k/<rest>` as key `<rest>`; lets every other path through.
fn key_of(req: &Req) -> Option<String> {
    req.uri().path().strip_prefix("/k/").map(str::to_owned)
}

fn post(path: &str) -> Req {
    Request::post(path).body(String::new()).unwrap()
}

/// A handler that counts its calls and echoes the fencing token it got.
fn counting(
    calls: Arc<AtomicUsize>,
) -> impl Service<Req, Response = Response<String>, Error = Infallible, Future = impl Send>
       + Clone
       + Send
       + 'static {
    tower::service_fn(move |req: Req| {
        calls.fetch_add(1, Ordering::SeqCst);
        let token = req.extensions().get::<FencingToken>().map(|t| t.0);
        async move { Ok::<_, Infallible>(Response::new(format!("{token:?}"))) }
    })
}

/// The layer every test builds (10 s ttl, 500 ms store timeout, keys from
/// `key_of`), with `shape` setting what the test is about.
fn built(
    locks: &Locks,
    shape: impl FnOnce(LeaseLayerBuilder) -> LeaseLayerBuilder,
) -> LeaseLayer<String> {
    shape(LeaseLayer::builder(locks.clone()).with_ttl(Duration::from_secs(10)))
        .with_store_timeout(Duration::from_millis(500))
        .with_key(key_of)
        .build()
        .unwrap()
}

fn layer(locks: &Locks, mode: Mode) -> LeaseLayer<String> {
    built(locks, |b| b.with_mode(mode))
}

/// A handler that always fails.
fn failing(
) -> impl Service<Req, Response = Response<String>, Error = &'static str, Future = impl Send>
       + Clone
       + Send
       + 'static {
    tower::service_fn(|_: Req| async { Err::<Response<String>, _>("handler failed") })
}

/// A handler that never answers, and the signal that it was entered.
fn stuck() -> (
    impl Service<Req, Response = Response<String>, Error = Infallible, Future = impl Send>
        + Clone
        + Send
        + 'static,
    tokio::sync::oneshot::Receiver<()>,
) {
    let (entered_tx, entered) = tokio::sync::oneshot::channel::<()>();
    let entered_tx = Arc::new(std::sync::Mutex::new(Some(entered_tx)));
    let handler = tower::service_fn(move |_: Req| {
        if let Some(tx) = entered_tx.lock().unwrap().take() {
            let _ = tx.send(());
        }
        std::future::pending::<Result<Response<String>, Infallible>>()
    });
    (handler, entered)
}

async fn json(response: Response<super::LockBody<String>>) -> serde_json::Value {
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        problem::CONTENT_TYPE
    );
    serde_json::from_slice(&collect(response.into_body()).await).unwrap()
}

#[tokio::test(start_paused = true)]
async fn passes_the_token_and_releases_after_the_response() {
    let locks = Locks::new(MemoryBackend::new()).with_background_runtime(Handle::current());
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = layer(&locks, Mode::Reject).layer(counting(calls.clone()));
    let first = svc.clone().oneshot(post("/k/a")).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(collect(first.into_body()).await, "Some(1)");
    assert!(locks.inspect("a").await.unwrap().is_none(), "released");
    let second = svc.oneshot(post("/k/a")).await.unwrap();
    assert_eq!(collect(second.into_body()).await, "Some(2)");
}

#[tokio::test(start_paused = true)]
async fn skipped_requests_take_no_lock() {
    let locks = Locks::new(MemoryBackend::new()).with_background_runtime(Handle::current());
    let _held = locks.try_acquire("a").await.unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = layer(&locks, Mode::Reject).layer(counting(calls.clone()));
    let response = svc.oneshot(post("/other")).await.unwrap();
    assert_eq!(collect(response.into_body()).await, "None");
}

#[tokio::test(start_paused = true)]
async fn reject_answers_409_without_calling_the_handler() {
    let locks = Locks::new(MemoryBackend::new()).with_background_runtime(Handle::current());
    let _held = locks
        .acquire_with(
            "a",
            &crate::AcquireOptions::new().with_ttl(Duration::from_millis(2500)),
        )
        .await
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = layer(&locks, Mode::Reject).layer(counting(calls.clone()));
    let response = svc.oneshot(post("/k/a")).await.unwrap();
    assert_eq!(response.status(), StatusCode::CONFLICT);
    assert_eq!(response.headers()[header::RETRY_AFTER], "3");
    let doc = json(response).await;
    assert_eq!(doc["type"], problem::LOCKED);
    assert_eq!(doc["status"], 409);
    assert_eq!(doc["key"], "a");
    assert_eq!(doc["retry_after_ms"], 2500);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn wait_proceeds_when_the_holder_releases() {
    let locks = Locks::new(MemoryBackend::new()).with_background_runtime(Handle::current());
    let held = locks.try_acquire("a").await.unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = layer(&locks, Mode::Wait(Duration::from_secs(5))).layer(counting(calls.clone()));
    let request = tokio::spawn(svc.oneshot(post("/k/a")));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(calls.load(Ordering::SeqCst), 0, "still waiting");
    held.release().await.unwrap();
    let response = request.await.unwrap().unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn wait_past_the_bound_answers_409_with_the_holders_remaining_ttl() {
    let locks = Locks::new(MemoryBackend::new()).with_background_runtime(Handle::current());
    let _held = locks.try_acquire("a").await.unwrap(); // 30 s
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = layer(&locks, Mode::Wait(Duration::from_secs(2))).layer(counting(calls.clone()));
    let started = tokio::time::Instant::now();
    let response = svc.oneshot(post("/k/a")).await.unwrap();
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert_eq!(response.status(), StatusCode::CONFLICT);
    assert_eq!(response.headers()[header::RETRY_AFTER], "28");
    assert_eq!(json(response).await["retry_after_ms"], 28_000);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn invalid_derived_key_is_a_400_problem() {
    let locks = Locks::new(MemoryBackend::new()).with_background_runtime(Handle::current());
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = layer(&locks, Mode::Reject).layer(counting(calls.clone()));
    let long = format!("/k/{}", "x".repeat(300));
    for path in ["/k/", long.as_str()] {
        let response = svc.clone().oneshot(post(path)).await.unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        assert_eq!(json(response).await["type"], problem::INVALID_KEY);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn store_failure_and_silence_are_503_problems() {
    let store = Faulty::default();
    let locks = Locks::new(store.clone()).with_background_runtime(Handle::current());
    let calls = Arc::new(AtomicUsize::new(0));
    for mode in [Mode::Reject, Mode::Wait(Duration::from_secs(1))] {
        let svc = layer(&locks, mode).layer(counting(calls.clone()));
        // A driver message that names the store, password included.
        let outage = Fault::Unavailable("injected outage at postgres://app:hunter22@db".into());
        for state in [outage, Fault::Hang] {
            store.set_all(state.clone());
            let response = svc.clone().oneshot(post("/k/a")).await.unwrap();
            assert_eq!(
                response.status(),
                StatusCode::SERVICE_UNAVAILABLE,
                "{mode:?} {state:?}"
            );
            assert_eq!(response.headers()[header::RETRY_AFTER], "1");
            let doc = json(response).await;
            assert_eq!(doc["type"], problem::STORE_UNAVAILABLE);
            assert_eq!(doc["status"], 503);
            // The store's error text (hosts, credentials) stays in the logs.
            let body = doc.to_string();
            assert!(
                !body.contains("hunter22") && !body.contains("injected"),
                "{body}"
            );
        }
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn handler_error_releases() {
    let locks = Locks::new(MemoryBackend::new()).with_background_runtime(Handle::current());
    let svc = layer(&locks, Mode::Reject).layer(failing());
    assert!(svc.oneshot(post("/k/a")).await.is_err());
    assert!(locks.inspect("a").await.unwrap().is_none());
}

#[tokio::test(start_paused = true)]
async fn dropped_request_releases() {
    let locks = Locks::new(MemoryBackend::new()).with_background_runtime(Handle::current());
    let (stuck, entered) = stuck();
    let svc = layer(&locks, Mode::Reject).layer(stuck);
    let request = tokio::spawn(svc.oneshot(post("/k/a")));
    entered.await.unwrap();
    assert!(
        locks.inspect("a").await.unwrap().is_some(),
        "held while the handler runs"
    );
    request.abort();
    let _ = request.await;
    // The guard's Drop released on a spawned task: let it run.
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(locks.inspect("a").await.unwrap().is_none());
}

// The concurrency limit (`with_permits`): the permit's release paths.

fn limit(locks: &Locks, permits: u32) -> LeaseLayer<String> {
    built(locks, |b| b.with_permits(permits))
}

async fn live_permits(locks: &Locks, key: &str) -> usize {
    locks
        .semaphore(key, 1)
        .unwrap()
        .holders()
        .await
        .unwrap()
        .len()
}

/// A streamed body: one frame per message, ends when the sender is dropped.
struct Streamed(tokio::sync::mpsc::UnboundedReceiver<bytes::Bytes>);

impl http_body::Body for Streamed {
    type Data = bytes::Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(http_body::Frame::data(c))))
    }
}

/// One request for key `a` through a limit of one permit, to a service
/// that answers with a [`Streamed`] body; the sender of its frames and
/// the response (its head only: the body has not been read).
async fn streamed_response(
    locks: &Locks,
) -> (
    tokio::sync::mpsc::UnboundedSender<bytes::Bytes>,
    Response<super::body::LockBody<Streamed>>,
) {
    let (chunks, rx) = tokio::sync::mpsc::unbounded_channel();
    let rx = Arc::new(std::sync::Mutex::new(Some(rx)));
    let streaming = tower::service_fn(move |req: Req| {
        let body = Streamed(rx.lock().unwrap().take().expect("one request"));
        assert!(req.extensions().get::<FencingToken>().is_some());
        async move { Ok::<_, Infallible>(Response::new(body)) }
    });
    let svc = limit(locks, 1).layer(streaming);
    (chunks, svc.oneshot(post("/k/a")).await.unwrap())
}

#[tokio::test(start_paused = true)]
async fn the_permit_is_held_while_the_body_streams_and_released_at_its_end() {
    let locks = Locks::new(MemoryBackend::new()).with_background_runtime(Handle::current());
    let (chunks, response) = streamed_response(&locks).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(live_permits(&locks, "a").await, 1, "held after the head");
    let mut body = response.into_body();
    chunks.send(bytes::Bytes::from_static(b"part")).unwrap();
    let frame =
        std::future::poll_fn(|cx| http_body::Body::poll_frame(std::pin::Pin::new(&mut body), cx))
            .await;
    assert!(frame.is_some());
    assert_eq!(live_permits(&locks, "a").await, 1, "held mid-body");
    drop(chunks);
    assert_eq!(collect(body).await, "");
    tokio::time::sleep(Duration::from_millis(10)).await; // the release task
    assert_eq!(live_permits(&locks, "a").await, 0, "released at the end");
}

#[tokio::test(start_paused = true)]
async fn a_body_dropped_unfinished_releases_the_permit() {
    let locks = Locks::new(MemoryBackend::new()).with_background_runtime(Handle::current());
    let (_chunks, response) = streamed_response(&locks).await;
    assert_eq!(live_permits(&locks, "a").await, 1);
    drop(response); // the client went away mid-body
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(live_permits(&locks, "a").await, 0);
}

#[tokio::test(start_paused = true)]
async fn the_limit_refuses_with_the_first_permits_remaining_time() {
    let locks = Locks::new(MemoryBackend::new()).with_background_runtime(Handle::current());
    let sem = locks.semaphore("a", 2).unwrap();
    let options = crate::AcquireOptions::new();
    let _long = sem
        .acquire_with(&options.clone().with_ttl(Duration::from_secs(20)))
        .await
        .unwrap();
    let _short = sem
        .acquire_with(&options.with_ttl(Duration::from_millis(4200)))
        .await
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = limit(&locks, 2).layer(counting(calls.clone()));
    let response = svc.clone().oneshot(post("/k/a")).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()[header::RETRY_AFTER], "5");
    let doc = json(response).await;
    assert_eq!(doc["type"], problem::LIMITED);
    assert_eq!(doc["retry_after_ms"], 4200);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    // A limit of 3 on the same key lets a third through.
    let wider = limit(&locks, 3).layer(counting(calls.clone()));
    assert_eq!(
        wider.oneshot(post("/k/a")).await.unwrap().status(),
        StatusCode::OK
    );
}

#[tokio::test(start_paused = true)]
async fn the_limit_releases_on_handler_error_and_dropped_request() {
    let locks = Locks::new(MemoryBackend::new()).with_background_runtime(Handle::current());
    assert!(limit(&locks, 1)
        .layer(failing())
        .oneshot(post("/k/a"))
        .await
        .is_err());
    assert_eq!(live_permits(&locks, "a").await, 0, "released on error");

    let (stuck, entered) = stuck();
    let request = tokio::spawn(limit(&locks, 1).layer(stuck).oneshot(post("/k/a")));
    entered.await.unwrap();
    assert_eq!(live_permits(&locks, "a").await, 1);
    request.abort();
    let _ = request.await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(live_permits(&locks, "a").await, 0, "released on drop");
}

#[tokio::test(start_paused = true)]
async fn the_limit_answers_503_store_problems_and_400_bad_keys() {
    let store = Faulty::default();
    let locks = Locks::new(store.clone()).with_background_runtime(Handle::current());
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = limit(&locks, 2).layer(counting(calls.clone()));
    for state in [Fault::Unavailable("down".into()), Fault::Hang] {
        store.set_all(state);
        let response = svc.clone().oneshot(post("/k/a")).await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(json(response).await["type"], problem::STORE_UNAVAILABLE);
    }
    store.recover();
    let response = svc.oneshot(post("/k/")).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}
