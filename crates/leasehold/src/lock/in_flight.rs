//! An acquire attempt at the store that outlives its caller: a grant the
//! store made for a caller that went away is given back, not left to hold
//! the key for a ttl.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::Locks;
use crate::backend::{Acquire, AcquireRequest, Backend, BoxFuture, Lease};
use crate::error::Result;

/// An acquire attempt at the store that is finished even if nobody waits
/// for it any more. Polled in place, so the common case (the caller takes
/// the answer) costs no task; dropped before its answer (the caller went
/// away: a dropped future, a `select!`, a disconnected HTTP client, or the
/// cancel token or backstop in [`Locks::attempt`]), it moves the attempt to
/// a task of the runtime it was dropped on (the background runtime outside
/// any), which waits for the answer (for at most a ttl: after that a grant
/// has expired anyway) and releases a grant at once. A runtime that ends
/// first ends the attempt too; its grant, if the store made one, expires.
/// While that release is on its way the key's next acquisition through
/// this handle waits for it, as for a dropped guard's release (not while
/// the answer is still awaited: a store that never answers would hold the
/// key up for a ttl).
pub(super) struct InFlight<'a> {
    pub(super) attempt: Option<BoxFuture<'static, Result<Acquire>>>,
    pub(super) locks: &'a Locks,
    pub(super) request: &'a Arc<AcquireRequest>,
}

impl Future for InFlight<'_> {
    type Output = Result<Acquire>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(attempt) = self.attempt.as_mut() else {
            // Polled after its answer: there is nothing more to come.
            return Poll::Pending;
        };
        let outcome = std::task::ready!(attempt.as_mut().poll(cx));
        self.attempt = None;
        Poll::Ready(outcome)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let Some(attempt) = self.attempt.take() else {
            return;
        };
        let backend = self.locks.backend.clone();
        let ttl = self.request.ttl();
        let pending = self.locks.pending.clone();
        let finish = async move {
            if let Ok(Ok(Acquire::Granted(lease))) = tokio::time::timeout(ttl, attempt).await {
                // Recorded only once there is a grant to give back: an
                // attempt the store never answers (a hung server) must not
                // hold up the key's next acquisitions for a ttl.
                let _pending = pending.begin(lease.key());
                tracing::debug!(key = %lease.key(), token = lease.token(), "a grant whose caller went away; giving it back");
                give_back(&*backend, &lease).await;
            }
        };
        // The attempt may hold timers and sockets of the runtime it was
        // polled on (the caller's): it is finished there, where they work,
        // and ends with that runtime, which drops its tasks when it shuts
        // down. Polled by another runtime after that one ended, its timer
        // would panic ("A Tokio 1.x context was found, but it is being
        // shutdown"). Dropped outside any runtime: the handle's own.
        match tokio::runtime::Handle::try_current() {
            Ok(caller) => drop(caller.spawn(finish)),
            Err(_) => self.locks.renewals.background().spawn(finish),
        }
    }
}

/// Releases `lease`, logging a failure (the lease then expires by itself).
pub(super) async fn give_back(backend: &dyn Backend, lease: &Lease) {
    if let Err(e) = backend.release(lease).await {
        tracing::warn!(key = %lease.key(), token = lease.token(), error = %e, "could not give an unused grant back; it will expire");
    }
}
