//! An axum service with one lock per account, keyed by a path segment.
//!
//! ```sh
//! cargo run -p leasehold --features http --example axum_path_key
//! LOCKS_URL=postgres://postgres@127.0.0.1/test \
//!   cargo run -p leasehold --features http,postgres --example axum_path_key
//! ```
//!
//! `POST /accounts/{id}/transfers` runs under the lock `account:{id}`. The
//! layer's key function sees the request before the handler's extractors,
//! so it cannot use axum's `Path`; [`PathKey`] reads the id from the path
//! by the route's own pattern. The layer is added with `route_layer`, so
//! only requests that matched the route take a lock, and the key names the
//! route's method, so a `GET` (answered `405`) takes none.
//!
//! The example serves on a free port and sends requests over TCP: a second
//! transfer on the same account while the first runs is answered `409
//! Conflict` (with `Retry-After`); a transfer on another account and the
//! next one on the first account go through.

use std::time::Duration;

use axum::{
    body::Body, extract::Extension, extract::Path, http::Method, http::Request, routing::post,
    Router,
};
use leasehold::http::{FencingToken, LeaseLayer, Mode, PathKey};
use leasehold::Locks;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The guarded work: slow enough that a second request meets the lock.
async fn transfer(
    Path(id): Path<String>,
    Extension(FencingToken(token)): Extension<FencingToken>,
) -> String {
    tokio::time::sleep(Duration::from_millis(500)).await;
    format!("transfer from account {id} done under token {token}\n")
}

fn app(locks: Locks) -> leasehold::Result<Router> {
    let account =
        PathKey::new("/accounts/{id}/transfers", "account:{id}")?.with_methods([Method::POST])?;
    let lock = LeaseLayer::builder(locks)
        .with_ttl(Duration::from_secs(10))
        .with_mode(Mode::Reject) // 409 at once while another transfer runs
        .with_key(move |req: &Request<Body>| account.for_request(req))
        .build()?;
    Ok(Router::new()
        .route("/accounts/{id}/transfers", post(transfer))
        .route_layer(lock))
}

#[tokio::main]
async fn main() -> Result<(), leasehold::BoxError> {
    let dir = tempfile::tempdir()?;
    let url = std::env::var("LOCKS_URL")
        .unwrap_or_else(|_| format!("sqlite://{}/locks.db", dir.path().display()));
    let locks = Locks::open(&url).await?;
    for id in ["1", "2"] {
        locks.force_release(&format!("account:{id}")).await?; // left over from an interrupted run
    }

    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    tokio::spawn(async move {
        axum::serve(listener, app(locks)?)
            .await
            .map_err(leasehold::Error::unavailable)
    });
    println!("serving on http://{addr}");

    let first = tokio::spawn(post_status(addr.clone(), "/accounts/1/transfers"));
    tokio::time::sleep(Duration::from_millis(150)).await; // the first one holds the lock now
    let same_account = post_status(addr.clone(), "/accounts/1/transfers").await?;
    let other_account = post_status(addr.clone(), "/accounts/2/transfers").await?;
    let first = first.await??;
    let after = post_status(addr.clone(), "/accounts/1/transfers").await?;

    println!("account 1, first transfer:        {first}");
    println!("account 1, meanwhile:             {same_account}");
    println!("account 2, meanwhile:             {other_account}");
    println!("account 1, after the first ended: {after}");
    assert!(first.starts_with("200"), "{first}");
    assert!(same_account.starts_with("409"), "{same_account}");
    assert!(other_account.starts_with("200"), "{other_account}");
    assert!(after.starts_with("200"), "{after}");
    Ok(())
}

/// Sends `POST path` with HTTP/1.1 and returns the status code and reason
/// (a real client such as reqwest or curl does the same).
async fn post_status(addr: String, path: &'static str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(&addr).await?;
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let status_line = response.lines().next().unwrap_or_default();
    Ok(status_line.trim_start_matches("HTTP/1.1 ").to_owned())
}
