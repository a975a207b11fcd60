//! Answering a call on the JS thread when it can be answered there.
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
//! - not finished: the same future, already past its synchronous part (on
//!   Redis, its command already written to the socket), moves to the
//!   runtime as before and the call returns its promise. Its next poll
//!   there registers the task's own waker: every tokio and leasehold
//!   primitive looks at its state again when polled, so a wake-up that came
//!   between the two polls (to the no-op waker of the first) is not lost.
//!
//! The first poll runs only what the future does before it first waits:
//! argument checks, in-process bookkeeping, writing a request to a socket
//! that is ready for it. Every store's client is asynchronous, so nothing
//! in that poll blocks the JS thread on the network.

use std::future::Future;
use std::task::{Context, Poll, Waker};

use napi::bindgen_prelude::{within_runtime_if_available, Either, PromiseRaw, ToNapiValue};
use napi::Env;

/// A value now, or the promise of one.
pub(crate) type Settled<'env, T> = Either<T, PromiseRaw<'env, T>>;

/// Polls `fut` once here; returns its value if it finished, else spawns it
/// on the runtime and returns its promise (see the module docs).
pub(crate) fn settle<'env, T, F>(env: &'env Env, fut: F) -> napi::Result<Settled<'env, T>>
where
    T: ToNapiValue + Send + 'static,
    F: Future<Output = napi::Result<T>> + Send + 'static,
{
    let mut fut = Box::pin(fut);
    let first =
        within_runtime_if_available(|| fut.as_mut().poll(&mut Context::from_waker(Waker::noop())));
    match first {
        Poll::Ready(value) => value.map(Either::A),
        Poll::Pending => env.spawn_future(fut).map(Either::B),
    }
}
