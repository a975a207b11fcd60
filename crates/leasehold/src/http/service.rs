//! [`LeaseService`]: the per-request path — take the lock, call the inner
//! service, release.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use ::http::{Request, Response};
use tokio::time::timeout;
use tower::Service;

use super::layer::{KeyFn, Mode, Settings};
use super::problem::Problem;
use super::{FencingToken, LockBody};
use crate::backend::BoxFuture;
use crate::error::Error;
use crate::guard::LeaseGuard;
use crate::lock::AcquireOptions;

/// The service a [`LeaseLayer`](super::LeaseLayer) wraps around an inner
/// service.
pub struct LeaseService<S, B> {
    pub(crate) inner: S,
    pub(crate) key: KeyFn<B>,
    pub(crate) settings: Arc<Settings>,
}

impl<S: Clone, B> Clone for LeaseService<S, B> {
    fn clone(&self) -> Self {
        LeaseService {
            inner: self.inner.clone(),
            key: self.key.clone(),
            settings: self.settings.clone(),
        }
    }
}

impl<S: std::fmt::Debug, B> std::fmt::Debug for LeaseService<S, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseService")
            .field("inner", &self.inner)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for LeaseService<S, ReqB>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Send + 'static,
    ResB: Send + 'static,
{
    type Response = Response<LockBody<ResB>>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        let key = (self.key.0)(&request);
        // Use the instance `poll_ready` prepared; leave a fresh clone for the
        // next call (the usual tower pattern for services moved into futures).
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let settings = self.settings.clone();
        // Everything happens inside the returned future: when the client goes
        // away and the server drops it, waiting stops and the guard's Drop
        // releases the lease.
        Box::pin(async move {
            match key {
                None => pass_through(inner, request).await,
                Some(key) => locked(&settings, inner, request, &key).await,
            }
        })
    }
}

async fn pass_through<S, ReqB, ResB>(
    mut inner: S,
    request: Request<ReqB>,
) -> Result<Response<LockBody<ResB>>, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
{
    Ok(inner.call(request).await?.map(LockBody::inner))
}

async fn locked<S, ReqB, ResB>(
    settings: &Settings,
    mut inner: S,
    mut request: Request<ReqB>,
    key: &str,
) -> Result<Response<LockBody<ResB>>, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
{
    let guard = match acquire(settings, key).await {
        Ok(guard) => guard,
        Err(problem) => return Ok(problem.into_response()),
    };
    request.extensions_mut().insert(FencingToken(guard.token()));
    // A panic in here unwinds through this future; whoever catches it drops
    // the future, and with it the guard, whose Drop releases best-effort.
    let outcome = inner.call(request).await;
    match outcome {
        // A concurrency limit counts requests in flight, and a request is in
        // flight until its body is sent: the body takes the permit along.
        Ok(response) if settings.permits.is_some() => {
            let store_timeout = settings.store_timeout;
            Ok(response.map(|body| LockBody::holding(body, guard, store_timeout)))
        }
        outcome => {
            release(guard, settings.store_timeout).await;
            Ok(outcome?.map(LockBody::inner))
        }
    }
}

/// Takes the lock as the mode says, or explains why not as a problem.
async fn acquire(settings: &Settings, key: &str) -> Result<LeaseGuard, Problem> {
    let mut options = AcquireOptions::new().with_ttl(settings.ttl);
    let mut bound = settings.store_timeout;
    if let Mode::Wait(wait) = settings.mode {
        options = options.with_wait(wait);
        bound = bound.saturating_add(wait);
    }
    let attempt = timeout(bound, async {
        match settings.permits {
            None => settings.locks.acquire_with(key, &options).await,
            Some(permits) => {
                // A bad key fails here, before any I/O, as the mutex's does.
                let semaphore = settings.locks.semaphore(key, permits)?;
                semaphore.acquire_with(&options).await
            }
        }
    })
    .await;
    let error = match attempt {
        Ok(Ok(guard)) => return Ok(guard),
        Ok(Err(error)) => error,
        Err(_) => {
            tracing::warn!(key, ?bound, "lock store did not answer in time");
            return Err(Problem::unavailable(key, true));
        }
    };
    let taken = |remaining| match settings.limit_status() {
        None => Problem::locked(key, remaining),
        Some(status) => Problem::limited(key, remaining, status),
    };
    let problem = match error {
        Error::Busy { remaining, .. } => taken(remaining),
        Error::Timeout {
            remaining: Some(remaining),
            ..
        } => taken(remaining),
        Error::Timeout { .. } => taken(remaining_after_wait(settings, key).await),
        Error::InvalidInput { problem, .. } => Problem::invalid_key(key, problem),
        Error::Unavailable { .. } | Error::Backend { .. } => {
            tracing::warn!(key, error = %error, "lock store failed");
            Problem::unavailable(key, error.is_retryable())
        }
        Error::KindMismatch { .. } => {
            tracing::error!(key, error = %error, "lock key of another kind");
            Problem::kind_mismatch(key, error.to_string())
        }
        // Neither can come out of an acquisition without a cancel token.
        Error::Cancelled { .. } | Error::LeaseLost { .. } => {
            tracing::error!(key, error = %error, "unexpected outcome of acquire");
            Problem::internal(key)
        }
    };
    tracing::debug!(key, status = %problem.status(), "request not let through");
    Err(problem)
}

/// A wait that timed out before any attempt at the store (queued behind
/// this process's own waiters) carries no remaining ttl: ask the store (for
/// a limit, the permit that expires first). A failed or slow answer, or a
/// lock freed meanwhile, gives the minimum.
async fn remaining_after_wait(settings: &Settings, key: &str) -> Duration {
    let remaining = async {
        match settings.permits {
            None => Ok(settings
                .locks
                .inspect(key)
                .await?
                .map(|info| info.remaining)),
            Some(permits) => {
                let holders = settings.locks.semaphore(key, permits)?.holders().await?;
                Ok::<_, Error>(holders.iter().map(|p| p.remaining).min())
            }
        }
    };
    match timeout(settings.store_timeout, remaining).await {
        Ok(Ok(Some(remaining))) => remaining,
        _ => Duration::ZERO,
    }
}

/// Releases on a task of its own, so that a client that disconnects while
/// the release is in flight cannot cut it short.
pub(crate) async fn release(guard: LeaseGuard, store_timeout: Duration) {
    let key = guard.key().to_string();
    let task = tokio::spawn(async move { timeout(store_timeout, guard.release()).await });
    match task.await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(error))) => {
            tracing::warn!(key, error = %error, "release failed; the lease will expire")
        }
        Ok(Err(_)) => tracing::warn!(key, "release timed out; the lease will expire"),
        Err(error) => tracing::warn!(key, error = %error, "release task failed"),
    }
}
