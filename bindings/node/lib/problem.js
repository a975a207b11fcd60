'use strict';
// RFC 9457 problem documents for the answers `lockRoute` gives itself, with
// the fields, type URIs and rounding of the Rust layer (leasehold::http), so
// a client reads one format whichever side served it.

const CONTENT_TYPE = 'application/problem+json';

/** `type` of each answer, the constants of `leasehold::http::problem`. */
const TYPES = Object.freeze({
  locked: 'tag:leasehold,2025:locked',
  storeUnavailable: 'tag:leasehold,2025:store-unavailable',
  invalidKey: 'tag:leasehold,2025:invalid-lock-key',
  // Node only so far: the Rust layer has no concurrency limiter.
  concurrencyLimit: 'tag:leasehold,2025:concurrency-limit',
});

/**
 * Whole seconds for `Retry-After`, rounded up, at least 1: a client that
 * retries when told must not arrive before the lease can have ended.
 */
function retryAfterSeconds(ms) {
  return Math.max(1, Math.ceil(ms / 1000));
}

/** 409: `key` is held for up to `remainingMs` more. */
function locked(key, remainingMs) {
  const ms = Math.ceil(remainingMs);
  return {
    status: 409,
    retryAfterMs: ms,
    doc: {
      type: TYPES.locked,
      title: 'Resource is locked',
      status: 409,
      detail: `another request holds the lock on this resource; retry in ${retryAfterSeconds(ms)} s`,
      key,
    },
  };
}

/**
 * 503 or 429 (`status`): every permit of the semaphore `key` is taken; one
 * can be free in `remainingMs` at the latest.
 */
function concurrencyLimit(key, status, remainingMs) {
  const ms = Math.ceil(remainingMs);
  return {
    status,
    retryAfterMs: ms,
    doc: {
      type: TYPES.concurrencyLimit,
      title: 'Too many concurrent requests',
      status,
      detail: `every permit for this resource is in use; retry in ${retryAfterSeconds(ms)} s`,
      key,
    },
  };
}

/** 503: the store failed; a transient failure says "retry in 1 s". */
function storeUnavailable(key, retryable) {
  return {
    status: 503,
    retryAfterMs: retryable ? 1000 : undefined,
    doc: {
      type: TYPES.storeUnavailable,
      title: 'Lock store unavailable',
      status: 503,
      detail: 'the lock for this resource could not be taken because the lock store failed; try again later',
      key,
    },
  };
}

/** 400: the key derived from the request is not a valid lock key. */
function invalidKey(key, why) {
  return {
    status: 400,
    retryAfterMs: undefined,
    doc: {
      type: TYPES.invalidKey,
      title: 'Invalid lock key',
      status: 400,
      detail: `the lock key derived from this request is invalid: ${why}`,
      // The bad key may hold control characters: echo it escaped.
      key: JSON.stringify(key).slice(1, -1),
    },
  };
}

/**
 * Writes `problem` to a Node `ServerResponse`. The wait appears as
 * `retryAfterMs` (this package's name) and as `retry_after_ms` (the Rust
 * layer's), so clients of either read the field they know.
 */
function send(res, problem) {
  const doc = { ...problem.doc };
  const headers = { 'Content-Type': CONTENT_TYPE };
  if (problem.retryAfterMs !== undefined) {
    doc.retryAfterMs = problem.retryAfterMs;
    doc.retry_after_ms = problem.retryAfterMs;
    headers['Retry-After'] = String(retryAfterSeconds(problem.retryAfterMs));
  }
  const body = JSON.stringify(doc);
  headers['Content-Length'] = String(Buffer.byteLength(body));
  res.writeHead(problem.status, headers);
  res.end(body);
}

module.exports = { CONTENT_TYPE, TYPES, retryAfterSeconds, locked, concurrencyLimit, storeUnavailable, invalidKey, send };
