//! Answering a call on the JS thread when it can be answered there, and
//! otherwise handing it to the runtime only once its answer has come.
//!
//! A `#[napi] async fn` spawns its future on the runtime's worker (a
//! wake-up of that thread) and settles its promise through a threadsafe
//! function (a wake-up of the JS thread): two thread hops per call even
//! when the answer needs no I/O (`memory://`, a busy key's in-process
//! queue) or has its request on the wire at once. [`settle`] polls the
//! future once on the JS thread instead, inside the runtime's context:
//!
//! - finished: the value goes back as the call's return value (the JS
//!   wrapper `await`s it like a promise), with no hop at all;
//! - not finished: the future, already past its synchronous part (on
//!   Redis, its command already written to the socket), has registered
//!   this call's own waker with whatever it waits on (the socket's
//!   readiness, a timer, a channel). The call returns a promise, and the
//!   future stays parked here until that waker fires: then, on the thread
//!   that woke it (the runtime's worker, reading the reply), it is spawned
//!   onto the runtime, finishes there, and settles the promise. Spawning at
//!   once instead (as before 7 December 2026) woke the worker only for it
//!   to poll the future, find nothing yet, and go back to waiting: one
//!   cross-thread wake-up per call for nothing. It overlapped the round
//!   trip, so latency did not move; the work did (README, "Performance").
//!
//! A future that returns pending has registered the waker it was polled
//! with (the `Future` contract; tokio's I/O, timers, channels and
//! cooperative yields all do), so a parked future is always woken. A
//! wake-up that comes before the future is parked (during the first poll
//! itself, or between that poll and the parking) is remembered, and the
//! parking then spawns it at once.
//!
//! The first poll runs only what the future does before it first waits:
//! argument checks, in-process bookkeeping, writing a request to a socket
//! that is ready for it. Every store's client is asynchronous, so nothing
//! in that poll blocks the JS thread on the network.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};

use napi::bindgen_prelude::{spawn, within_runtime_if_available, Either, PromiseRaw, ToNapiValue};
use napi::{Env, JsDeferred, JsValue};

/// A value now, or the promise of one.
pub(crate) type Settled<'env, T> = Either<T, PromiseRaw<'env, T>>;

type Call<T> = Pin<Box<dyn Future<Output = napi::Result<T>> + Send>>;
type Resolver<T> = Box<dyn FnOnce(Env) -> napi::Result<T> + Send>;

/// Polls `fut` once here; returns its value if it finished, else a promise
/// that the runtime settles once the future is woken (see the module docs).
pub(crate) fn settle<'env, T, F>(env: &'env Env, fut: F) -> napi::Result<Settled<'env, T>>
where
    T: ToNapiValue + Send + 'static,
    F: Future<Output = napi::Result<T>> + Send + 'static,
{
    let parked = Arc::new(Parked::new(finish::<T>));
    let waker = Waker::from(parked.clone());
    let mut fut: Call<T> = Box::pin(fut);
    let first = within_runtime_if_available(|| fut.as_mut().poll(&mut Context::from_waker(&waker)));
    match first {
        Poll::Ready(value) => value.map(Either::A),
        Poll::Pending => {
            let (deferred, promise) = env.create_deferred::<T, Resolver<T>>()?;
            parked.park((fut, deferred));
            Ok(Either::B(PromiseRaw::new(env.raw(), promise.raw())))
        }
    }
}

/// Runs the rest of a call on the runtime and settles its promise.
fn finish<T: ToNapiValue + Send + 'static>((fut, deferred): (Call<T>, JsDeferred<T, Resolver<T>>)) {
    spawn(async move {
        let mut unsettled = Unsettled(Some(deferred));
        let outcome = fut.await;
        let Some(deferred) = unsettled.0.take() else {
            return;
        };
        match outcome {
            Ok(value) => deferred.resolve(Box::new(move |_| Ok(value))),
            Err(e) => deferred.reject(e),
        }
    });
}

/// A promise not settled yet: rejected if the call's task ends without
/// settling it (a panic in the call), as napi-rs's own `async fn` calls
/// are, instead of leaving the caller waiting forever.
struct Unsettled<T: ToNapiValue + 'static>(Option<JsDeferred<T, Resolver<T>>>);

impl<T: ToNapiValue + 'static> Drop for Unsettled<T> {
    fn drop(&mut self) {
        if let Some(deferred) = self.0.take() {
            deferred.reject(napi::Error::new(
                napi::Status::GenericFailure,
                "leasehold: the native call ended without an answer (a panic)",
            ));
        }
    }
}

/// The waker of a call polled once: what is parked in it (the call and its
/// promise) is passed to `run` at the first wake-up, or at the parking if
/// the wake-up came first; never twice.
struct Parked<C> {
    stage: Mutex<Stage<C>>,
    run: fn(C),
}

enum Stage<C> {
    /// Polled once, not parked yet, not woken.
    Polled,
    /// Woken before it was parked: to run as soon as it is.
    WokenEarly,
    /// Parked, waiting for its wake-up.
    Waiting(C),
    /// Handed to `run`: later wake-ups belong to whatever it started.
    Running,
}

impl<C: Send> Parked<C> {
    fn new(run: fn(C)) -> Self {
        Parked {
            stage: Mutex::new(Stage::Polled),
            run,
        }
    }

    fn stage(&self) -> MutexGuard<'_, Stage<C>> {
        // Each critical section only moves the stage on: a panic cannot
        // leave it half-changed, so poison is ignored.
        self.stage.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Parks `parked` after the first poll, or runs it at once if the call
    /// was already woken.
    fn park(&self, parked: C) {
        let mut stage = self.stage();
        if matches!(*stage, Stage::WokenEarly) {
            *stage = Stage::Running;
            drop(stage);
            (self.run)(parked);
        } else {
            *stage = Stage::Waiting(parked);
        }
    }
}

impl<C: Send> Wake for Parked<C> {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let mut stage = self.stage();
        match std::mem::replace(&mut *stage, Stage::Running) {
            Stage::Waiting(parked) => {
                drop(stage);
                (self.run)(parked);
            }
            Stage::Polled | Stage::WokenEarly => *stage = Stage::WokenEarly,
            Stage::Running => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static RUNS: AtomicUsize = AtomicUsize::new(0);

    fn count(n: usize) {
        RUNS.fetch_add(n, Ordering::SeqCst);
    }

    // One test: the counter is shared.
    #[test]
    fn a_parked_call_runs_once_at_its_first_wake_up_whenever_that_comes() {
        // Woken after parking: runs then, once.
        let p = Arc::new(Parked::new(count));
        let waker = Waker::from(p.clone());
        p.park(1);
        assert_eq!(RUNS.load(Ordering::SeqCst), 0, "not before its wake-up");
        waker.wake_by_ref();
        waker.wake_by_ref();
        assert_eq!(RUNS.load(Ordering::SeqCst), 1);

        // Woken before parking (during its first poll): runs at the parking.
        let p = Arc::new(Parked::new(count));
        Waker::from(p.clone()).wake();
        assert_eq!(RUNS.load(Ordering::SeqCst), 1);
        p.park(10);
        assert_eq!(RUNS.load(Ordering::SeqCst), 11);
        Waker::from(p.clone()).wake();
        assert_eq!(RUNS.load(Ordering::SeqCst), 11, "never twice");

        // Never woken: never run.
        let p = Arc::new(Parked::new(count));
        p.park(100);
        drop(p);
        assert_eq!(RUNS.load(Ordering::SeqCst), 11);
    }
}
