'use strict';
// TEMPORARY: a minimal stand-in for `require('leasehold/express')`, with
// the same contract, until bindings/node ships it. app.js requires it in one
// line; delete this file and require 'leasehold/express' there instead.
//
// lockRoute(locks, { key: (req) => string, ttl, wait }) holds a lease on the
// key while the route runs (req.lease); busy: 409 + Retry-After + RFC 9457
// problem body; store down: 503; released when the response finishes or the
// client goes away.

function problem(res, status, fields, headers = {}) {
  res.status(status).set({ 'content-type': 'application/problem+json', ...headers });
  res.end(JSON.stringify({ status, ...fields }));
}

function lockRoute(locks, { key, ttl = '30s', wait = 0 } = {}) {
  return async (req, res, next) => {
    const name = key(req);
    const gone = new AbortController();
    res.once('close', () => gone.abort());
    let lease;
    try {
      lease = await locks.acquire(name, { ttl, wait, signal: gone.signal });
    } catch (error) {
      if (error.code === 'LEASEHOLD_BUSY' || error.code === 'LEASEHOLD_TIMEOUT') {
        const retryAfterMs = error.retryAfterMs ?? 1000;
        return problem(res, 409, {
          title: 'Resource is locked',
          detail: 'another request holds the lock on this resource',
          key: name,
          retryAfterMs,
        }, { 'retry-after': String(Math.max(1, Math.ceil(retryAfterMs / 1000))) });
      }
      if (error.code === 'LEASEHOLD_CANCELLED') return undefined;
      if (error.code === 'LEASEHOLD_UNAVAILABLE') {
        return problem(res, 503, { title: 'Lock store unavailable', detail: error.message, key: name });
      }
      return next(error);
    }
    req.lease = lease;
    const release = () => lease.release().catch(() => {});
    res.once('finish', release);
    res.once('close', release);
    return next();
  };
}

module.exports = { lockRoute };
