//! `PathKey` in an axum router, as docs/http.md describes it: added with
//! `route_layer`, the layer runs after routing (axum's `MatchedPath` is in
//! the extensions) and locks the key built from the path parameter; with
//! `with_methods`, only for the methods the route serves.
#![cfg(feature = "http")]

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::MatchedPath;
use axum::http::{Method, Request, StatusCode};
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

/// A request `app` answers with its own status: a method the route does not
/// serve meets axum's `405` (a route layer runs for it too), not the lock.
async fn status_of_method(app: &Router, method: Method, path: &str) -> StatusCode {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .body(Body::empty())
        .unwrap();
    app.clone().oneshot(request).await.unwrap().status()
}

#[tokio::test]
async fn a_method_the_route_does_not_serve_takes_no_lock_and_gets_its_405() {
    let locks = Locks::open("memory://").await.unwrap();
    let account = PathKey::new("/accounts/{id}/transfers", "account:{id}")
        .unwrap()
        .with_methods([Method::POST])
        .unwrap();
    let layer = LeaseLayer::builder(locks.clone())
        .with_key(move |req: &Request<Body>| account.for_request(req))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/accounts/{id}/transfers", post(|| async { "done" }))
        .route_layer(layer);

    // A GET on the POST-only route: 405, and the fence of the key untouched.
    let path = "/accounts/7/transfers";
    assert_eq!(
        status_of_method(&app, Method::GET, path).await,
        StatusCode::METHOD_NOT_ALLOWED
    );
    assert_eq!(status_of(&app, path).await, StatusCode::OK);
    let after = locks.try_acquire("account:7").await.unwrap();
    assert_eq!(after.token(), 2, "only the POST took the lock before");

    // While a POST holds the lock, a GET still gets its 405, not a 409.
    assert_eq!(
        status_of_method(&app, Method::GET, path).await,
        StatusCode::METHOD_NOT_ALLOWED
    );
    assert_eq!(status_of(&app, path).await, StatusCode::CONFLICT);
    after.release().await.unwrap();
}

/// The alternative http.md names: the layer on the method router, which axum
/// runs only for the methods that router serves, locks no `405` either.
#[tokio::test]
async fn a_layer_on_the_method_router_takes_no_lock_for_other_methods() {
    let locks = Locks::open("memory://").await.unwrap();
    let account = PathKey::new("/accounts/{id}/transfers", "account:{id}").unwrap();
    let layer = LeaseLayer::builder(locks.clone())
        .with_key(move |req: &Request<Body>| account.for_request(req))
        .build()
        .unwrap();
    let app = Router::new().route(
        "/accounts/{id}/transfers",
        post(|| async { "done" }).route_layer(layer),
    );

    let held = locks.try_acquire("account:7").await.unwrap();
    let path = "/accounts/7/transfers";
    assert_eq!(
        status_of_method(&app, Method::GET, path).await,
        StatusCode::METHOD_NOT_ALLOWED
    );
    assert_eq!(status_of(&app, path).await, StatusCode::CONFLICT);
    held.release().await.unwrap();
    assert_eq!(status_of(&app, path).await, StatusCode::OK);
}
