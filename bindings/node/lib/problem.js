'use strict';
// RFC 9457 problem documents for the answers `lockRoute` and
// `limitConcurrency` give themselves. The documents are the Rust HTTP
// layer's own (`leasehold::http::problem`, through the addon), so a client
// reads one format whichever side served it; this file only writes them.

const native = require('./binding').load();
const { nativeSync } = require('./errors');

const CONTENT_TYPE = native.PROBLEM_CONTENT_TYPE;

/** `type` of each answer, the constants of `leasehold::http::problem`. */
const TYPES = Object.freeze({
  locked: native.PROBLEM_LOCKED,
  storeUnavailable: native.PROBLEM_STORE_UNAVAILABLE,
  invalidKey: native.PROBLEM_INVALID_KEY,
  concurrencyLimit: native.PROBLEM_CONCURRENCY_LIMIT,
});

/** The addon's answer with absent hints as `undefined`. */
function answer(made) {
  return {
    status: made.status,
    retryAfterSecs: made.retryAfterSecs ?? undefined,
    retryAfterMs: made.retryAfterMs ?? undefined,
    body: made.body,
  };
}

/** 409: `key` is held for up to `remainingMs` more. */
const locked = (key, remainingMs) => answer(nativeSync(() => native.problemLocked(key, remainingMs)));

/** 503 or 429 (`status`): every permit of `key` is taken for up to `remainingMs` more. */
const concurrencyLimit = (key, status, remainingMs) =>
  answer(nativeSync(() => native.problemConcurrencyLimit(key, status, remainingMs)));

/** 503: the store failed; a transient failure says "retry in 1 s". */
const storeUnavailable = (key, retryable) => answer(native.problemStoreUnavailable(key, Boolean(retryable)));

/** 400: the key derived from the request is not a valid lock key. */
const invalidKey = (key, why) => answer(native.problemInvalidKey(key, String(why)));

/**
 * Writes `problem` to a Node `ServerResponse`. The wait appears as
 * `retry_after_ms` (the Rust layer's name) and as `retryAfterMs` (this
 * package's), so clients of either read the field they know.
 */
function send(res, problem) {
  let body = problem.body;
  const headers = { 'Content-Type': CONTENT_TYPE };
  if (problem.retryAfterMs !== undefined) {
    body = JSON.stringify({ ...JSON.parse(body), retryAfterMs: problem.retryAfterMs });
    headers['Retry-After'] = String(problem.retryAfterSecs);
  }
  headers['Content-Length'] = String(Buffer.byteLength(body));
  res.writeHead(problem.status, headers);
  res.end(body);
}

module.exports = { CONTENT_TYPE, TYPES, locked, concurrencyLimit, storeUnavailable, invalidKey, send };
