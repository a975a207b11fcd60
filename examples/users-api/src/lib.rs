//! A users API whose multi-step create runs under a collection-level
//! leasehold lock: the hand-written "`locks` document per collection + 409
//! middleware" pattern, done right.
//!
//! `POST /users` takes the lock `collection:users` through
//! [`leasehold::http::LeaseLayer`], then checks that the username is free,
//! inserts the user and bumps the `users` counter with a fenced write.
//! Reads take no lock. The data lives on SQLite or MongoDB ([`UserStore`]).
//! See the README for the routes and curl commands.

pub mod cli;
pub mod db;
mod routes;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use http::{Method, Request};
use leasehold::http::{LeaseLayer, Mode};
use leasehold::Locks;

pub use db::{MongoUsers, SqliteUsers, UserStore};

/// The lock every create takes: one per collection, as in the hand-written
/// pattern.
pub const USERS_LOCK: &str = "collection:users";

/// How the app guards creates.
#[derive(Debug, Clone)]
pub struct LockSettings {
    /// Lease length; renewed while a create runs.
    pub ttl: Duration,
    /// Reject with 409 at once, or wait up to a bound.
    pub mode: Mode,
}

/// Everything a handler needs.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The app's data.
    pub users: Arc<dyn UserStore>,
    /// Pause between "check the username is free" and "insert", standing in
    /// for the latency of a multi-document write (0 in production; the
    /// tests and the demo widen the race window with it).
    pub step_delay: Duration,
}

/// The app. `lock: None` serves the same routes without the lock layer: the
/// racy baseline for the tests and the benchmark.
///
/// # Errors
/// [`leasehold::Error::InvalidInput`] for a ttl or wait bound out of range.
pub fn app(state: AppState, locks: Locks, lock: Option<LockSettings>) -> leasehold::Result<Router> {
    let router = routes::router(state);
    let Some(settings) = lock else {
        return Ok(router);
    };
    let layer = LeaseLayer::builder(locks)
        .with_ttl(settings.ttl)
        .with_mode(settings.mode)
        .with_key(users_lock_key)
        .build()?;
    Ok(router.layer(layer))
}

/// Writes to the users collection take its lock; reads do not.
fn users_lock_key(request: &Request<Body>) -> Option<String> {
    let writes_users =
        request.method() == Method::POST && request.uri().path().trim_end_matches('/') == "/users";
    writes_users.then(|| USERS_LOCK.to_owned())
}
