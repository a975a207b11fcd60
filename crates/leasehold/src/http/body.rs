//! [`LockBody`]: the response body of a [`LeaseService`](super::LeaseService),
//! either the inner service's body or a problem document the layer wrote.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::guard::LeaseGuard;

pin_project! {
    /// The body of a response that went through the lease layer: the inner
    /// service's body untouched, or the `application/problem+json` document
    /// of a 409/503/400 the layer answered itself.
    ///
    /// It is an `http_body::Body` with `Bytes` data whenever the inner body
    /// is, so axum, hyper and tonic accept it as they accept the inner body.
    ///
    /// Under a concurrency limit the body holds the request's permit: it is
    /// released when the body ends (or fails), and by the guard's `Drop` when
    /// the server drops the body unfinished (the client went away).
    pub struct LockBody<B> {
        #[pin]
        kind: Kind<B>,
        permit: Option<(LeaseGuard, Duration)>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        // `None` once the one data frame was sent.
        Problem { json: Option<Bytes> },
    }
}

impl<B> LockBody<B> {
    /// Wraps the inner service's body.
    pub fn inner(body: B) -> Self {
        LockBody {
            kind: Kind::Inner { body },
            permit: None,
        }
    }

    /// Wraps the inner service's body, holding `permit` until it ends;
    /// `store_timeout` bounds the release.
    pub(crate) fn holding(body: B, permit: LeaseGuard, store_timeout: Duration) -> Self {
        LockBody {
            kind: Kind::Inner { body },
            permit: Some((permit, store_timeout)),
        }
    }

    pub(crate) fn problem(json: Bytes) -> Self {
        LockBody {
            kind: Kind::Problem { json: Some(json) },
            permit: None,
        }
    }
}

/// Releases a permit whose body ended, on a task of its own (a body is
/// polled, not awaited). Without a runtime, dropping the guard leaves the
/// permit to expire after its ttl, which is all that can be done there.
fn release_permit(permit: &mut Option<(LeaseGuard, Duration)>) {
    if let Some((guard, store_timeout)) = permit.take() {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(super::service::release(guard, store_timeout));
        }
    }
}

impl<B: Body<Data = Bytes>> Body for LockBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        match this.kind.project() {
            KindProj::Inner { body } => {
                let frame = body.poll_frame(cx);
                // The end of the body (or its failure) is the end of the
                // request's work: give the permit back now rather than when
                // the server gets round to dropping the body.
                if matches!(frame, Poll::Ready(None | Some(Err(_)))) {
                    release_permit(this.permit);
                }
                frame
            }
            KindProj::Problem { json } => Poll::Ready(json.take().map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Problem { json } => json.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Problem { json } => {
                SizeHint::with_exact(json.as_ref().map_or(0, |b| b.len() as u64))
            }
        }
    }
}

impl<B> std::fmt::Debug for LockBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Inner { .. } => f.write_str("LockBody::Inner"),
            Kind::Problem { json } => f.debug_tuple("LockBody::Problem").field(json).finish(),
        }
    }
}

/// Reads a whole body; for the layer's own tests.
#[cfg(test)]
pub(crate) async fn collect<B>(body: B) -> Bytes
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Debug,
{
    let mut body = body;
    let mut out = Vec::new();
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        if let Ok(data) = frame.unwrap().into_data() {
            out.extend_from_slice(&data);
        }
    }
    Bytes::from(out)
}
