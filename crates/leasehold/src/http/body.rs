//! [`LockBody`]: the response body of a [`LeaseService`](super::LeaseService),
//! either the inner service's body or a problem document the layer wrote.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// The body of a response that went through the lease layer: the inner
    /// service's body untouched, or the `application/problem+json` document
    /// of a 409/503/400 the layer answered itself.
    ///
    /// It is an `http_body::Body` with `Bytes` data whenever the inner body
    /// is, so axum, hyper and tonic accept it as they accept the inner body.
    pub struct LockBody<B> {
        #[pin]
        kind: Kind<B>,
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
        }
    }

    pub(crate) fn problem(json: Bytes) -> Self {
        LockBody {
            kind: Kind::Problem { json: Some(json) },
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
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
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
