//! Shared by the HTTP tests: a server on 127.0.0.1:0, a client, a store that
//! fails on demand, and problem+json checks.
#![allow(dead_code)] // each test binary uses a different part

use std::time::Duration;

use axum::Router;
use leasehold::testing::Faulty;
use leasehold::Locks;
use reqwest::{header, StatusCode};
use tokio::task::JoinHandle;

/// Serves `router` on a fresh loopback port until the handle is dropped or
/// aborted; returns the base URL.
pub async fn serve(router: Router) -> (String, JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (format!("http://{addr}"), task)
}

/// A client whose every request ends within 60 s: a hung request fails the
/// test instead of hanging it.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// A SQLite lock store in `dir`, wrapped so tests can break it.
pub async fn sqlite_store(dir: &tempfile::TempDir) -> Faulty {
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    Faulty::new(leasehold::open::open_backend(&url).await.unwrap())
}

/// A `Locks` handle on `store`.
pub fn locks(store: &Faulty) -> Locks {
    Locks::new(store.clone())
}

/// Checks that `response` is a problem document with `status` and the
/// RFC 9457 members; returns it.
pub async fn problem(response: reqwest::Response, status: StatusCode) -> serde_json::Value {
    assert_eq!(response.status(), status);
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "application/problem+json"
    );
    let doc: serde_json::Value = response.json().await.unwrap();
    assert!(doc["type"].is_string(), "{doc}");
    assert!(doc["title"].is_string(), "{doc}");
    assert!(doc["detail"].is_string(), "{doc}");
    assert_eq!(doc["status"], status.as_u16(), "{doc}");
    doc
}

/// Checks a lock 409: `Retry-After` of at least one whole second, and the
/// layer's problem body for `key`.
pub async fn locked(response: reqwest::Response, key: &str) {
    let status = response.status();
    if status != StatusCode::CONFLICT {
        let body = response.text().await.unwrap_or_default();
        panic!("expected a 409 lock answer for {key}, got {status}: {body}");
    }
    let retry_after: u64 = response.headers()[header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry_after >= 1);
    let doc = problem(response, StatusCode::CONFLICT).await;
    assert_eq!(doc["type"], leasehold::http::problem::LOCKED);
    assert_eq!(doc["key"], key);
    let ms = doc["retry_after_ms"].as_u64().unwrap();
    assert!(
        ms.div_ceil(1000).max(1) == retry_after,
        "{ms} ms vs {retry_after} s"
    );
}

/// POSTs to `url` until it is not answered 409, for at most 10 s: the
/// release on drop is best-effort on a background task, so give it a moment.
pub async fn first_non_409(client: &reqwest::Client, url: &str) -> StatusCode {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let status = client.post(url).send().await.unwrap().status();
        if status != StatusCode::CONFLICT || tokio::time::Instant::now() >= deadline {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The MongoDB test server's URL (`LEASEHOLD_TEST_MONGODB`) with a fresh
/// database in its path, so tests running in parallel on one server (and
/// their fixed usernames and lock keys) do not meet. `None` skips the test,
/// unless `LEASEHOLD_REQUIRE_SERVERS=1` makes that a failure.
pub fn mongodb_url() -> Option<String> {
    let url = leasehold::conformance::server_url("LEASEHOLD_TEST_MONGODB")?;
    let db = format!("users_api_{:016x}", rand::random::<u64>());
    Some(leasehold::conformance::with_database(&url, &db))
}
