//! HTTP middleware (feature `http`): run a request under a lease lock, and
//! answer `409 Conflict` while another request holds it, or wait a bounded
//! time; or limit how many requests of a key run at once across processes.
//!
//! [`LeaseLayer`] is a `tower::Layer`, so it works in axum, hyper and tonic.
//! For each request:
//!
//! 1. **The key.** A closure derives the lock key from the request
//!    (`Some("users".into())`, `Some(format!("order:{id}"))`), or returns
//!    `None` to let the request through without a lock (safe methods, say).
//!    The closure runs before the handler's extractors, so it sees the path,
//!    not parsed path parameters: [`PathKey`] builds a key from the path by
//!    the route's own pattern (`/accounts/{id}` → `account:{id}`), for the
//!    methods the route serves ([`PathKey::with_methods`]).
//!    A derived key that is not a valid [`Key`](crate::Key) is answered
//!    `400 Bad Request`: keys usually embed request data.
//! 2. **The lock.** [`Mode::Reject`] tries once; [`Mode::Wait`] waits up to
//!    its bound, woken by the store's release notification. If the lock
//!    stays taken the answer is `409 Conflict` with `Retry-After` (the
//!    holder's remaining ttl rounded up to whole seconds, at least 1) and an
//!    `application/problem+json` body (RFC 9457): `type`, `title`,
//!    `status`, `detail`, `key`, `retry_after_ms`. The inner service is not
//!    called.
//! 3. **The handler** runs with a [`FencingToken`] in the request extensions
//!    (in axum: `Extension<FencingToken>`), to pass to fenced writes. The
//!    lease renews itself every ttl/3 meanwhile, so a handler may run longer
//!    than the ttl.
//! 4. **The release** happens when the inner service's response future
//!    resolves, that is when the response *head* is ready. A streamed body
//!    is sent after the release: do the guarded work before returning the
//!    response.
//!
//! The lock is released on every path: after a response or an error from
//! the inner service, and when the request future is dropped (the client
//! disconnected, a timeout layer fired, or a panic in the handler unwound
//! through it) by the guard's `Drop`, which releases best-effort on a
//! background task. If even that cannot reach the store, the lease expires
//! after its ttl.
//!
//! A store that fails ([`Error::Unavailable`](crate::Error::Unavailable),
//! [`Error::Backend`](crate::Error::Backend)), or does not answer within the
//! store timeout, gives `503 Service Unavailable` with a problem body; the
//! store's error text is logged, not sent. (A grant that reaches the store
//! after the timeout fired goes unused and expires after its ttl.) The layer never panics on a
//! request. Every answer the layer writes itself has the type URIs in
//! [`problem`].
//!
//! **Concurrency limit.** With
//! [`with_permits(n)`](LeaseLayerBuilder::with_permits) a request takes one
//! of `n` permits of its key (a [`Semaphore`](crate::Semaphore)) instead of
//! the key's lock: at most `n` requests of a key are in flight across every
//! process on the store. The permit is held until the response *body* ends
//! (or is dropped); a request that gets none within the mode is answered
//! `503` (or `429`, [`LimitStatus`]) with `Retry-After` from the permit that
//! expires first, type [`problem::LIMITED`]. Everything else is as above.
//!
//! The layer speaks HTTP statuses. Under tonic it works as it does anywhere
//! (the response body type is generic), but gRPC clients see a 409 or 503
//! as an HTTP-level failure (`UNKNOWN`/`UNAVAILABLE`), not as a gRPC status
//! with the problem body.
//!
//! ```
//! use std::time::Duration;
//! use http::{Method, Request, Response, StatusCode};
//! use leasehold::http::{FencingToken, LeaseLayer, Mode};
//! use leasehold::Locks;
//! use tower::{Layer, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
//! let locks = Locks::open("memory://").await?;
//! let layer = LeaseLayer::builder(locks.clone())
//!     .with_ttl(Duration::from_secs(10))
//!     .with_mode(Mode::Wait(Duration::from_millis(300)))
//!     .with_key(|req: &Request<String>| {
//!         // Reads need no lock; every write to /users locks the collection.
//!         (!req.method().is_safe()).then(|| "users".to_owned())
//!     })
//!     .build()?;
//!
//! let app = layer.layer(tower::service_fn(|req: Request<String>| async move {
//!     let token = req.extensions().get::<FencingToken>().copied();
//!     Ok::<_, std::convert::Infallible>(Response::new(format!("{token:?}")))
//! }));
//!
//! let _held = locks.try_acquire("users").await?; // somebody else is creating a user
//! let post = Request::post("/users").body(String::new()).unwrap();
//! let response = app.clone().oneshot(post).await.unwrap();
//! assert_eq!(response.status(), StatusCode::CONFLICT); // after waiting 300 ms
//! assert!(response.headers().contains_key("retry-after"));
//!
//! let get = Request::get("/users").body(String::new()).unwrap();
//! assert_eq!(app.oneshot(get).await.unwrap().status(), StatusCode::OK);
//! # Ok(()) }
//! ```

mod body;
mod layer;
mod path_key;
pub mod problem;
mod service;

pub use body::LockBody;
pub use layer::{
    KeyFn, LeaseLayer, LeaseLayerBuilder, LimitStatus, Mode, NoKey, DEFAULT_STORE_TIMEOUT,
};
pub use path_key::PathKey;
pub use service::LeaseService;

/// The fencing token of the lease a request runs under, put into the request
/// extensions by [`LeaseLayer`].
///
/// Pass it to every write the request makes to a resource that checks
/// tokens, so a request whose lease was lost (a long pause, a broken lock)
/// cannot overwrite the work of a newer holder:
///
/// ```sql
/// UPDATE counters SET value = value + 1, fence = ?token
///  WHERE name = 'users' AND fence <= ?token;  -- 0 rows: a newer holder exists
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub u64);

#[cfg(test)]
mod tests;
