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
    let same = app
        .clone()
        .oneshot(post_to("/accounts/7/transfers"))
        .await
        .unwrap();
    assert_eq!(same.status(), StatusCode::CONFLICT);
    // Another spelling of the same id meets the same lock.
    let escaped = app
        .clone()
        .oneshot(post_to("/accounts/%37/transfers"))
        .await
        .unwrap();
    assert_eq!(escaped.status(), StatusCode::CONFLICT);
    let other = app
        .clone()
        .oneshot(post_to("/accounts/8/transfers"))
        .await
        .unwrap();
    assert_eq!(other.status(), StatusCode::OK);
    held.release().await.unwrap();
    let after = app
        .clone()
        .oneshot(post_to("/accounts/7/transfers"))
        .await
        .unwrap();
    assert_eq!(after.status(), StatusCode::OK);

    // Unrouted requests never reach a route layer: no key, no lock.
    let missing = app.oneshot(post_to("/nowhere")).await.unwrap();
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    let seen = seen_routes.lock().unwrap().clone();
    assert_eq!(seen.len(), 4, "{seen:?}");
    assert!(
        seen.iter()
            .all(|r| r.as_deref() == Some("/accounts/{id}/transfers")),
        "{seen:?}"
    );
}
