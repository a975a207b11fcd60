//! [`LeaseLayer`] and its builder: which requests lock what, for how long,
//! and what to do when the lock is taken.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ::http::{Request, StatusCode};
use tower::Layer;

use super::LeaseService;
use crate::backend::validate_permits;
use crate::error::{Error, Result};
use crate::lock::Locks;
use crate::time::{validate_ttl, DEFAULT_TTL, MAX_TTL};

/// What a request does when its lock is held by another request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Mode {
    /// Answer `409 Conflict` at once, with `Retry-After`.
    Reject,
    /// Wait up to this long (woken by the store's release notification),
    /// then proceed, or answer `409` as [`Mode::Reject`] does.
    Wait(Duration),
}

/// What a request of a concurrency-limited layer
/// ([`LeaseLayerBuilder::with_permits`]) is answered when no permit came.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum LimitStatus {
    /// `503 Service Unavailable`: the service is at capacity (the default;
    /// what load balancers and retrying clients expect of an overloaded
    /// backend).
    #[default]
    ServiceUnavailable,
    /// `429 Too Many Requests`: for a limit that is a quota of the caller's
    /// (a key per tenant or per API key), not the service's capacity.
    TooManyRequests,
}

impl LimitStatus {
    pub(crate) fn status(self) -> StatusCode {
        match self {
            LimitStatus::ServiceUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            LimitStatus::TooManyRequests => StatusCode::TOO_MANY_REQUESTS,
        }
    }
}

/// Default bound on one store operation made by the layer (acquire beyond
/// the wait, inspect, release): a store that does not answer becomes a 503
/// instead of a hung request.
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_secs(5);

/// The key function has not been set; [`LeaseLayerBuilder::build`] is only
/// available after [`with_key`](LeaseLayerBuilder::with_key).
#[derive(Debug, Clone, Copy)]
pub struct NoKey;

/// A key function set with [`LeaseLayerBuilder::with_key`], for requests
/// with body type `B`. Boxed, so that the layer's type names only the body
/// type: `LeaseLayer<axum::body::Body>`.
pub struct KeyFn<B>(pub(crate) Arc<DynKeyFn<B>>);

type DynKeyFn<B> = dyn Fn(&Request<B>) -> Option<String> + Send + Sync;

impl<B> Clone for KeyFn<B> {
    fn clone(&self) -> Self {
        KeyFn(self.0.clone())
    }
}

impl<B> fmt::Debug for KeyFn<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyFn(..)")
    }
}

/// Everything but the key function; not generic, so the request path
/// compiles once.
#[derive(Debug)]
pub(crate) struct Settings {
    pub(crate) locks: Locks,
    pub(crate) ttl: Duration,
    pub(crate) mode: Mode,
    pub(crate) store_timeout: Duration,
    /// `Some(n)`: a concurrency limit, each request takes one of `n` permits
    /// of its key (a semaphore) instead of the key's mutex.
    pub(crate) permits: Option<u32>,
    pub(crate) limit_status: Option<LimitStatus>,
}

impl Settings {
    /// The status of a request that got no permit; `None` for a lock (409).
    pub(crate) fn limit_status(&self) -> Option<LimitStatus> {
        self.permits.map(|_| self.limit_status.unwrap_or_default())
    }
}

/// Builds a [`LeaseLayer`]. Start with [`LeaseLayer::builder`].
///
/// Defaults: ttl 30 s (renewed every ttl/3 while the handler runs),
/// [`Mode::Reject`], store timeout 5 s. A key function is required.
#[derive(Debug)]
#[must_use = "call build() to get the layer"]
pub struct LeaseLayerBuilder<K = NoKey> {
    locks: Locks,
    key: K,
    ttl: Duration,
    mode: Mode,
    store_timeout: Duration,
    permits: Option<u32>,
    limit_status: Option<LimitStatus>,
}

impl<K> LeaseLayerBuilder<K> {
    setters! {
        /// The lease length (100 ms ..= 24 h, checked by `build`). The guard
        /// renews it every ttl/3, so a handler may run longer than the ttl; the
        /// ttl is how long a crashed process keeps the resource locked.
        with_ttl(ttl: Duration) => ttl = ttl;

        /// What to do when the lock is held: [`Mode::Reject`] or
        /// [`Mode::Wait`] (a bound over 0 and at most 24 h, checked by `build`).
        with_mode(mode: Mode) => mode = mode;

        /// Bound on each store call beyond the wait (10 ms ..= 24 h, checked by
        /// `build`); a store that does not answer in time gives a 503.
        with_store_timeout(timeout: Duration) => store_timeout = timeout;
    }

    /// Makes the layer a concurrency limit across every process sharing the
    /// store: each request takes one of `permits` permits of its key (a
    /// [`Semaphore`](crate::Semaphore), `1 ..=` [`MAX_PERMITS`](crate::MAX_PERMITS),
    /// checked by `build`) instead of the key's lock, so up to `permits`
    /// requests of a key run at once. The permit is held until the response
    /// body has been sent (or dropped), not only until the response head.
    /// A request that gets no permit within the [`Mode`] is answered with
    /// [`LimitStatus`] (503 by default) and `Retry-After`.
    pub fn with_permits(mut self, permits: u32) -> Self {
        self.permits = Some(permits);
        self
    }

    /// The answer of a concurrency limit when no permit came: 503 (the
    /// default) or 429. Only with [`with_permits`](Self::with_permits)
    /// (`build` refuses it otherwise).
    pub fn with_limit_status(mut self, status: LimitStatus) -> Self {
        self.limit_status = Some(status);
        self
    }

    /// Which lock a request takes: `Some(key)` to lock, `None` to let the
    /// request through untouched (e.g. safe methods).
    ///
    /// The closure's parameter needs its type written out, e.g.
    /// `|req: &Request<axum::body::Body>|`, since nothing else names the
    /// body type. A key that is not a valid [`Key`](crate::Key) (empty,
    /// over 256 bytes, control characters) is answered `400 Bad Request`
    /// with a problem document: keys usually embed request data, such as a
    /// path segment, so a bad key is the request's fault, not the server's.
    pub fn with_key<B, F>(self, key: F) -> LeaseLayerBuilder<KeyFn<B>>
    where
        F: Fn(&Request<B>) -> Option<String> + Send + Sync + 'static,
    {
        LeaseLayerBuilder {
            locks: self.locks,
            key: KeyFn(Arc::new(key)),
            ttl: self.ttl,
            mode: self.mode,
            store_timeout: self.store_timeout,
            permits: self.permits,
            limit_status: self.limit_status,
        }
    }
}

impl<B> LeaseLayerBuilder<KeyFn<B>> {
    /// Checks the settings and builds the layer.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a ttl outside 100 ms ..= 24 h, a wait
    /// bound of zero or over 24 h, a store timeout outside 10 ms ..= 24 h,
    /// permits outside 1 ..= [`MAX_PERMITS`](crate::MAX_PERMITS), or a limit
    /// status without permits.
    pub fn build(self) -> Result<LeaseLayer<B>> {
        validate_ttl(self.ttl)?;
        if let Some(permits) = self.permits {
            validate_permits(permits)?;
        } else if self.limit_status.is_some() {
            return Err(Error::invalid(
                "limit status",
                "applies to a concurrency limit only: set with_permits too",
            ));
        }
        if let Mode::Wait(bound) = self.mode {
            if bound.is_zero() || bound > MAX_TTL {
                return Err(Error::invalid(
                    "wait",
                    format!("must be over 0 and at most 24h (use Mode::Reject to not wait), got {bound:?}"),
                ));
            }
        }
        if self.store_timeout < Duration::from_millis(10) || self.store_timeout > MAX_TTL {
            return Err(Error::invalid(
                "store timeout",
                format!("must be between 10ms and 24h, got {:?}", self.store_timeout),
            ));
        }
        Ok(LeaseLayer {
            key: self.key,
            settings: Arc::new(Settings {
                locks: self.locks,
                ttl: self.ttl,
                mode: self.mode,
                store_timeout: self.store_timeout,
                permits: self.permits,
                limit_status: self.limit_status,
            }),
        })
    }
}

/// A `tower::Layer` that runs each request (body type `B`) under a lease
/// lock.
///
/// See the [module docs](crate::http) for the behaviour and an example.
pub struct LeaseLayer<B> {
    pub(crate) key: KeyFn<B>,
    pub(crate) settings: Arc<Settings>,
}

impl LeaseLayer<()> {
    /// Starts configuring a layer that takes its locks from `locks`.
    pub fn builder(locks: Locks) -> LeaseLayerBuilder<NoKey> {
        LeaseLayerBuilder {
            locks,
            key: NoKey,
            ttl: DEFAULT_TTL,
            mode: Mode::Reject,
            store_timeout: DEFAULT_STORE_TIMEOUT,
            permits: None,
            limit_status: None,
        }
    }
}

impl<B> LeaseLayer<B> {
    /// The lease length.
    pub fn ttl(&self) -> Duration {
        self.settings.ttl
    }

    /// What a request does when its lock is held.
    pub fn mode(&self) -> Mode {
        self.settings.mode
    }

    /// The permits of each key of a concurrency limit; `None` for a lock.
    pub fn permits(&self) -> Option<u32> {
        self.settings.permits
    }
}

impl<B> Clone for LeaseLayer<B> {
    fn clone(&self) -> Self {
        LeaseLayer {
            key: self.key.clone(),
            settings: self.settings.clone(),
        }
    }
}

impl<B> fmt::Debug for LeaseLayer<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseLayer")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl<S, B> Layer<S> for LeaseLayer<B> {
    type Service = LeaseService<S, B>;

    fn layer(&self, inner: S) -> Self::Service {
        LeaseService {
            inner,
            key: self.key.clone(),
            settings: self.settings.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn builder() -> LeaseLayerBuilder<KeyFn<()>> {
        LeaseLayer::builder(Locks::new(crate::backends::memory::MemoryBackend::new()))
            .with_key(|_: &Request<()>| Some("k".to_owned()))
    }

    fn problem(b: LeaseLayerBuilder<KeyFn<()>>) -> String {
        b.build().unwrap_err().to_string()
    }

    #[test]
    fn build_validates_before_serving() {
        assert!(builder().build().is_ok());
        assert!(problem(builder().with_ttl(Duration::from_millis(5))).contains("invalid ttl"));
        assert!(problem(builder().with_mode(Mode::Wait(Duration::ZERO))).contains("invalid wait"));
        assert!(problem(builder().with_mode(Mode::Wait(MAX_TTL * 2))).contains("invalid wait"));
        assert!(problem(builder().with_store_timeout(Duration::ZERO)).contains("store timeout"));
        let layer = builder()
            .with_ttl(Duration::from_secs(2))
            .with_mode(Mode::Wait(Duration::from_secs(1)))
            .build()
            .unwrap();
        assert_eq!(layer.ttl(), Duration::from_secs(2));
        assert_eq!(layer.mode(), Mode::Wait(Duration::from_secs(1)));
        assert_eq!(layer.permits(), None);
    }

    #[test]
    fn build_validates_the_limit() {
        let limit = builder()
            .with_permits(3)
            .with_limit_status(LimitStatus::TooManyRequests)
            .build()
            .unwrap();
        assert_eq!(limit.permits(), Some(3));
        assert!(builder().with_permits(crate::MAX_PERMITS).build().is_ok());
        for bad in [0, crate::MAX_PERMITS + 1] {
            assert!(problem(builder().with_permits(bad)).contains("invalid permits"));
        }
        let status_alone = builder().with_limit_status(LimitStatus::TooManyRequests);
        assert!(problem(status_alone).contains("invalid limit status"));
        // The ttl bounds hold for permits as for locks.
        assert!(problem(builder().with_permits(2).with_ttl(MAX_TTL * 2)).contains("invalid ttl"));
    }
}
