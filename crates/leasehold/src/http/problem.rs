//! RFC 9457 problem documents for the answers the layer gives itself.
//!
//! Every body has `type`, `title`, `status`, `detail` and `key` (the lock
//! key); a 409, and a 503/429 of a concurrency limit, add `retry_after_ms`. Store errors are logged, never sent to
//! the client: their text can name hosts and paths.
//!
//! [`Problem`] is public so that a layer in another framework answers in
//! the same words: the Node package's Express middleware renders its
//! answers through it (`bindings/node/src/policy.rs`).

use std::time::Duration;

use ::http::{header, HeaderValue, Response, StatusCode};
use bytes::Bytes;

use super::{LimitStatus, LockBody};

/// The media type of every answer the layer writes itself.
pub const CONTENT_TYPE: &str = "application/problem+json";

/// `type` of a 409: the resource is locked by another request.
pub const LOCKED: &str = "tag:leasehold,2025:locked";
/// `type` of the 503 (or 429) of a concurrency limit: every permit of the
/// key is taken by other requests.
pub const LIMITED: &str = "tag:leasehold,2025:concurrency-limit";
/// `type` of a 503: the lock store failed or did not answer in time.
pub const STORE_UNAVAILABLE: &str = "tag:leasehold,2025:store-unavailable";
/// `type` of a 400: the key function derived a key that is not a valid lock
/// key (empty, over 256 bytes, or with control characters).
pub const INVALID_KEY: &str = "tag:leasehold,2025:invalid-lock-key";
/// `type` of a 500 the layer cannot classify further (a bug, not a state).
pub const INTERNAL: &str = "tag:leasehold,2025:internal";
/// The problem type of a lock key that is a lock of another kind (500).
pub const KIND_MISMATCH: &str = "tag:leasehold,2025:lock-kind-mismatch";

/// One answer the layer gives without calling the inner service: its
/// status, its `Retry-After`, and its problem document.
#[derive(Debug, Clone)]
pub struct Problem {
    status: StatusCode,
    kind: &'static str,
    title: &'static str,
    detail: String,
    key: String,
    retry_after: Option<Duration>,
}

impl Problem {
    /// 409: `key` is held for up to `remaining` more.
    pub fn locked(key: &str, remaining: Duration) -> Self {
        let secs = retry_after_secs(remaining);
        Problem {
            status: StatusCode::CONFLICT,
            kind: LOCKED,
            title: "Resource is locked",
            detail: format!("another request holds the lock on this resource; retry in {secs} s"),
            key: key.to_owned(),
            retry_after: Some(remaining),
        }
    }

    /// 503 or 429 (`status`): every permit of `key` is taken, the first of
    /// them for up to `remaining` more.
    pub fn limited(key: &str, remaining: Duration, status: LimitStatus) -> Self {
        let secs = retry_after_secs(remaining);
        Problem {
            status: status.status(),
            kind: LIMITED,
            title: "Concurrency limit reached",
            detail: format!(
                "every permit for this resource is taken by other requests; retry in {secs} s"
            ),
            key: key.to_owned(),
            retry_after: Some(remaining),
        }
    }

    /// 503: the store failed; `retryable` adds `Retry-After: 1`.
    pub fn unavailable(key: &str, retryable: bool) -> Self {
        Problem {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: STORE_UNAVAILABLE,
            title: "Lock store unavailable",
            detail: "the lock for this resource could not be taken because the lock store failed; \
                     try again later"
                .to_owned(),
            key: key.to_owned(),
            retry_after: retryable.then_some(Duration::from_secs(1)),
        }
    }

    /// 400: the derived key is not a valid lock key; `problem` says why.
    pub fn invalid_key(key: &str, problem: String) -> Self {
        Problem {
            status: StatusCode::BAD_REQUEST,
            kind: INVALID_KEY,
            title: "Invalid lock key",
            detail: format!("the lock key derived from this request is invalid: {problem}"),
            // The bad key itself may hold control characters: echo it escaped.
            key: key.escape_debug().to_string(),
            retry_after: None,
        }
    }

    /// 500: an outcome the layer does not expect.
    pub fn internal(key: &str) -> Self {
        Problem {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: INTERNAL,
            title: "Lock layer error",
            detail: "the lock layer failed unexpectedly".to_owned(),
            key: key.to_owned(),
            retry_after: None,
        }
    }

    /// The request's lock key is a lock of another kind (a semaphore's key
    /// used as a mutex, say: [`Error::KindMismatch`](crate::Error::KindMismatch)):
    /// the application's programming error, so a 500 that says so, never
    /// a 409 a client would retry.
    pub fn kind_mismatch(key: &str, detail: String) -> Self {
        Problem {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: KIND_MISMATCH,
            title: "Lock key of another kind",
            detail,
            key: key.to_owned(),
            retry_after: None,
        }
    }

    /// The HTTP status this problem is answered with.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The `Retry-After` header's value: whole seconds, rounded up, at
    /// least 1; none for an answer that is not worth retrying as is.
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after.map(retry_after_secs)
    }

    /// The body's `retry_after_ms`: the wait in milliseconds, rounded up.
    pub fn retry_after_ms(&self) -> Option<u64> {
        self.retry_after.map(retry_after_millis)
    }

    /// The problem document (the body, with content type [`CONTENT_TYPE`]).
    pub fn to_json(&self) -> String {
        let mut doc = serde_json::json!({
            "type": self.kind,
            "title": self.title,
            "status": self.status.as_u16(),
            "detail": self.detail,
            "key": self.key,
        });
        if let Some(ms) = self.retry_after_ms() {
            doc["retry_after_ms"] = serde_json::Value::from(ms);
        }
        // Serializing a `Value` built from strings and numbers cannot fail.
        serde_json::to_string(&doc).unwrap_or_default()
    }

    /// The answer: status, `Content-Type`, `Retry-After` if any, JSON body.
    pub(crate) fn into_response<B>(self) -> Response<LockBody<B>> {
        let json = self.to_json();
        let mut response = Response::new(LockBody::problem(Bytes::from(json)));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
        if let Some(secs) = self.retry_after_secs() {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// Whole seconds for `Retry-After`, rounded up, at least 1: a client that
/// retries when told must not arrive before the lease can have ended.
pub(crate) fn retry_after_secs(wait: Duration) -> u64 {
    let secs = wait.as_nanos().div_ceil(1_000_000_000).max(1);
    u64::try_from(secs).unwrap_or(u64::MAX)
}

/// Milliseconds for `retry_after_ms`, rounded up.
fn retry_after_millis(wait: Duration) -> u64 {
    u64::try_from(wait.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::body::collect;
    use http_body::Body as _;

    #[test]
    fn retry_after_rounds_up_to_at_least_one_second() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1000)), 1);
        assert_eq!(retry_after_secs(Duration::from_nanos(1_000_000_001)), 2);
        assert_eq!(retry_after_secs(Duration::from_millis(29_500)), 30);
        assert_eq!(retry_after_millis(Duration::from_micros(1500)), 2);
    }

    #[tokio::test]
    async fn locked_has_retry_after_and_all_fields() {
        let r = Problem::locked("users", Duration::from_millis(1200)).into_response::<String>();
        assert_eq!(r.status(), StatusCode::CONFLICT);
        assert_eq!(r.headers()[header::CONTENT_TYPE], CONTENT_TYPE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "2");
        let hint = r.body().size_hint().exact();
        let bytes = collect(r.into_body()).await;
        assert_eq!(hint, Some(bytes.len() as u64));
        let doc: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(doc["type"], LOCKED);
        assert_eq!(doc["status"], 409);
        assert_eq!(doc["key"], "users");
        assert_eq!(doc["retry_after_ms"], 1200);
        assert!(doc["title"].is_string() && doc["detail"].is_string());
    }

    #[tokio::test]
    async fn limited_has_its_status_retry_after_and_type() {
        for (limit, status) in [
            (
                LimitStatus::ServiceUnavailable,
                StatusCode::SERVICE_UNAVAILABLE,
            ),
            (LimitStatus::TooManyRequests, StatusCode::TOO_MANY_REQUESTS),
        ] {
            let r = Problem::limited("api", Duration::from_millis(4001), limit)
                .into_response::<String>();
            assert_eq!(r.status(), status);
            assert_eq!(r.headers()[header::RETRY_AFTER], "5");
            let doc: serde_json::Value =
                serde_json::from_slice(&collect(r.into_body()).await).unwrap();
            assert_eq!(doc["type"], LIMITED);
            assert_eq!(doc["status"], status.as_u16());
            assert_eq!(doc["key"], "api");
            assert_eq!(doc["retry_after_ms"], 4001);
        }
    }

    /// What another framework's layer reads (the Node middleware): the
    /// same figures the response carries.
    #[test]
    fn the_parts_agree_with_the_response() {
        let p = Problem::unavailable("users", true);
        assert_eq!(p.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            (p.retry_after_secs(), p.retry_after_ms()),
            (Some(1), Some(1000))
        );
        let doc: serde_json::Value = serde_json::from_str(&p.to_json()).unwrap();
        assert_eq!(doc["type"], STORE_UNAVAILABLE);
        assert_eq!(doc["retry_after_ms"], 1000);
        let p = Problem::unavailable("users", false);
        assert_eq!((p.retry_after_secs(), p.retry_after_ms()), (None, None));
        let p = Problem::locked("users", Duration::from_micros(1_500_001));
        assert_eq!(
            (p.retry_after_secs(), p.retry_after_ms()),
            (Some(2), Some(1501))
        );
    }

    #[tokio::test]
    async fn invalid_key_escapes_the_key_and_has_no_retry_after() {
        let r = Problem::invalid_key("a\nb", "bad".into()).into_response::<String>();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        assert!(r.headers().get(header::RETRY_AFTER).is_none());
        let doc: serde_json::Value = serde_json::from_slice(&collect(r.into_body()).await).unwrap();
        assert_eq!(doc["key"], "a\\nb");
        assert_eq!(doc["type"], INVALID_KEY);
        assert!(doc.get("retry_after_ms").is_none());
    }
}
