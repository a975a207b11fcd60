//! `PathKey` in an axum router, as docs/http.md describes it: added with
//! `route_layer`, the layer runs after routing (axum's `MatchedPath` is in
//! the extensions) and locks the key built from the path parameter.
#![cfg(feature = "http")]

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::MatchedPath;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use axum::Router;
use leasehold::http::{LeaseLayer, PathKey};
use leasehold::Locks;
use tower::ServiceExt;

fn post_to(path: &str) -> Request<Body> {
    Request::post(path).body(Body::empty()).unwrap()
}

/// The status `app` answers a POST to `path` with.
async fn status_of(app: &Router, path: &str) -> StatusCode {
    app.clone().oneshot(post_to(path)).await.unwrap().status()
}

#[tokio::test]
async fn a_route_layer_locks_the_key_from_the_path_parameter() {
    let locks = Locks::open("memory://").await.unwrap();
    let seen_routes = Arc::new(Mutex::new(Vec::new()));
    let account = PathKey::new("/accounts/{id}/transfers", "account:{id}").unwrap();
    let seen = seen_routes.clone();
    let layer = LeaseLayer::builder(locks.clone())
        .with_key(move |req: &Request<Body>| {
            let route = req.extensions().get::<MatchedPath>();
            seen.lock()
                .unwrap()
                .push(route.map(|r| r.as_str().to_owned()));
            account.for_request(req)
        })
        .build()
        .unwrap();
    let app = Router::new()
        .route("/accounts/{id}/transfers", post(|| async { "done" }))
        .route_layer(layer);

    let held = locks.try_acquire("account:7").await.unwrap();
    for (path, status) in [
        ("/accounts/7/transfers", StatusCode::CONFLICT),
        // Another spelling of the same id meets the same lock.
        ("/accounts/%37/transfers", StatusCode::CONFLICT),
        ("/accounts/8/transfers", StatusCode::OK),
    ] {
        assert_eq!(status_of(&app, path).await, status, "{path}");
    }
    held.release().await.unwrap();
    assert_eq!(
        status_of(&app, "/accounts/7/transfers").await,
        StatusCode::OK
    );

    // Unrouted requests never reach a route layer: no key, no lock.
    assert_eq!(status_of(&app, "/nowhere").await, StatusCode::NOT_FOUND);
    let seen = seen_routes.lock().unwrap().clone();
    assert_eq!(seen.len(), 4, "{seen:?}");
    assert!(
        seen.iter()
            .all(|r| r.as_deref() == Some("/accounts/{id}/transfers")),
        "{seen:?}"
    );
}
