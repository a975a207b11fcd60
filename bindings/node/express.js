'use strict';
// `require('leasehold/express')`: `lockRoute(locks, { key, ttl, wait })`, a
// plain `(req, res, next)` middleware that runs a route under a lease lock.
// `limitConcurrency(locks, { key, permits, ttl, wait, status })` caps the
// requests in flight across every process with a semaphore.
// They need no Express at run time, so Connect-style frameworks work too.

const { Locks } = require('./index.js');
const { toMillis } = require('./lib/duration');
const { invalidInput, nativeSync } = require('./lib/errors');
const problem = require('./lib/problem');
// The defaults are the core's: the lease length, and how long a finished
// response waits for its release before it is sent anyway (the lease then
// expires after its ttl), the Rust layer's default store timeout.
const { checkRouteOptions, DEFAULT_TTL_MS, RELEASE_BOUND_MS } = require('./lib/binding').load();

const OPTION_NAMES = new Set(['key', 'ttl', 'wait', 'retryAfter', 'onError']);
const LIMIT_OPTION_NAMES = new Set(['key', 'permits', 'ttl', 'wait', 'status', 'retryAfter', 'onError']);

/** The ttl and wait of a middleware's options, in milliseconds, checked. */
function routeTiming(options) {
  const ttlMs = toMillis(options.ttl ?? DEFAULT_TTL_MS, 'ttl');
  const waitMs = toMillis(options.wait ?? 0, 'wait');
  nativeSync(() => checkRouteOptions(ttlMs, waitMs));
  return { ttlMs, waitMs };
}

/**
 * The `retryAfter` and `onError` options, checked. `retryAfter` replaces the
 * busy answer's hint (by default the holder's remaining ttl, which is the
 * longest the wait can be, not the likely one): a duration, or a function
 * of `{ key, holderRemainingMs }` returning one. `onError(error, req)` hears
 * every store failure and invalid key the middleware answers itself (503,
 * 400), which would otherwise never reach the application's logs.
 */
function answerOptions(options) {
  const { retryAfter, onError } = options;
  let hintOf = (key, remainingMs) => remainingMs;
  if (typeof retryAfter === 'function') {
    hintOf = (key, remainingMs) => toMillis(retryAfter({ key, holderRemainingMs: remainingMs }), 'retryAfter');
  } else if (retryAfter !== undefined) {
    const ms = toMillis(retryAfter, 'retryAfter');
    hintOf = () => ms;
  }
  if (onError !== undefined && typeof onError !== 'function') {
    throw invalidInput('invalid onError: expected a function (error, req) => void');
  }
  return { hintOf, onError };
}

/**
 * What each middleware factory checks first: `locks` is a Locks, and
 * `options` an object (`shape` in the error) with no name outside `names`.
 */
function checkDeclaration(what, locks, options, names, shape) {
  if (!(locks instanceof Locks)) throw invalidInput('invalid locks: expected a Locks from Locks.open(url)');
  if (options === null || typeof options !== 'object') throw invalidInput(`invalid options: expected ${shape}`);
  for (const name of Object.keys(options)) {
    if (!names.has(name)) {
      const known = [...names];
      const list = `${known.slice(0, -1).join(', ')} and ${known.at(-1)}`;
      throw invalidInput(`invalid option ${JSON.stringify(name)}: ${what} takes ${list}`);
    }
  }
}

/** Checks the options once, when the route is declared, not per request. */
function routeOptions(locks, options) {
  checkDeclaration('lockRoute', locks, options, OPTION_NAMES, '{ key: (req) => string, ttl, wait }');
  if (typeof options.key !== 'function') throw invalidInput('invalid key: expected a function (req) => string');
  return { keyOf: options.key, ...routeTiming(options), ...answerOptions(options) };
}

/** The problem answer for an acquire that failed, or null if there is none. */
function problemFor(error, key, hintOf) {
  switch (error?.code) {
    case 'LEASEHOLD_BUSY':
    case 'LEASEHOLD_TIMEOUT':
      // A timeout's holder lookup can miss (the key was freed meanwhile):
      // then the shortest hint, as the Rust layer gives.
      return problem.locked(key, hintOf(key, error.retryAfterMs ?? 0));
    case 'LEASEHOLD_UNAVAILABLE':
      return problem.storeUnavailable(key, error.retryable);
    case 'LEASEHOLD_INVALID_INPUT':
      // The options were checked up front, so it is the derived key.
      return problem.invalidKey(key, error.message);
    default:
      return null;
  }
}

/** Resolves when `promise` settles or after `ms`, whichever comes first. */
function settledWithin(promise, ms) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    timer.unref();
    promise.finally(() => {
      clearTimeout(timer);
      resolve();
    });
  });
}

/**
 * Holds the lease until the response ends or the client disconnects,
 * whichever comes first. The release runs before the response's last bytes
 * go out (as in express-session, by wrapping `res.end`): a client that has
 * its answer finds the lock free for its next request.
 */
function releaseWithResponse(res, lease) {
  let released;
  const release = () => {
    released ??= lease.release().catch(() => {
      // The store failed: the lease expires after its ttl, and the next
      // request on this key hears about the outage as a 503.
    });
    return released;
  };
  res.once('close', release);
  const end = res.end;
  let ending = false;
  res.end = function endAfterRelease(...args) {
    if (!ending) {
      ending = true;
      settledWithin(release(), RELEASE_BOUND_MS).then(() => {
        res.end = end;
        end.apply(res, args);
      });
    }
    return res;
  };
}

/**
 * Calls `use(key)` with the request's key, or `next` alone when the key
 * function returns null or undefined (no lock for this request), or
 * `next(error)` when it throws.
 */
async function withKey(keyOf, req, next, use) {
  let key;
  try {
    key = await keyOf(req);
  } catch (error) {
    return next(error);
  }
  if (key === undefined || key === null) return next();
  return use(key);
}

/**
 * Waits for `take(signal)` to grant `key` while the client stays, then
 * continues the route with the grant as `req[field]` until the response
 * ends. A refusal is answered: `busy(error)` for a busy key or timeout when
 * given, else the problem for the error, else `next(error)`.
 */
async function holdForResponse(req, res, next, { key, field, take, busy, hintOf, onError }) {
  // An async key function can outlast the client: then its 'close' has
  // already been emitted, and nobody is left to answer.
  if (res.destroyed) return undefined;
  // A client that disconnects while waiting stops the wait.
  const gone = new AbortController();
  const onGone = () => gone.abort();
  res.once('close', onGone);
  let grant;
  try {
    grant = await take(gone.signal);
  } catch (error) {
    if (gone.signal.aborted) return undefined; // nobody left to answer
    const refused = error?.code === 'LEASEHOLD_BUSY' || error?.code === 'LEASEHOLD_TIMEOUT';
    let answer;
    try {
      answer = busy && refused ? busy(error) : problemFor(error, key, hintOf);
    } catch (hintError) {
      return next(hintError); // a retryAfter function that threw or returned no duration
    }
    // onError hears failures, not a busy key: that is the route working.
    if (answer && onError && !refused) {
      try {
        onError(error, req);
      } catch {
        // A failing logger must not leave the request unanswered.
      }
    }
    if (answer) return problem.send(res, answer);
    return next(error);
  } finally {
    res.removeListener('close', onGone);
  }
  if (gone.signal.aborted) {
    // The client left just as the store granted it.
    await grant.release().catch(() => {});
    return undefined;
  }
  req[field] = grant;
  releaseWithResponse(res, grant);
  return next();
}

/**
 * A middleware that runs the rest of the route under a lease on
 * `options.key(req)` (null or undefined: no lock for this request).
 *
 * - busy (after waiting up to `wait`, default 0): 409, `Retry-After` and a
 *   problem+json body; the route does not run
 * - store down: 503 problem+json; a derived key that is not valid: 400
 * - otherwise `req.lease` is the Lease (its `token` for fenced writes) and
 *   it is released when the response ends, the client disconnects, or the
 *   handler's error ends in an error response
 * - a key function that throws goes to `next(error)`
 *
 * Throws LEASEHOLD_INVALID_INPUT at once for bad options.
 */
function lockRoute(locks, options) {
  const { keyOf, ttlMs, waitMs, hintOf, onError } = routeOptions(locks, options);

  function lockThenContinue(req, res, next) {
    return withKey(keyOf, req, next, (key) => {
      if (typeof key !== 'string') {
        return next(invalidInput(`invalid key: the key function returned a ${typeof key}, expected a string, null or undefined`));
      }
      const take = (signal) => locks.acquire(key, { ttl: ttlMs, wait: waitMs, signal });
      return holdForResponse(req, res, next, { key, field: 'lease', take, hintOf, onError });
    });
  }

  // The promise is for frameworks that await middleware (Express 5); every
  // failure inside is already answered or passed to `next`.
  return function leaseholdLockRoute(req, res, next) {
    return lockThenContinue(req, res, next);
  };
}

/** Checks limitConcurrency's options once, when the route is declared. */
function limitOptions(locks, options) {
  checkDeclaration('limitConcurrency', locks, options, LIMIT_OPTION_NAMES, '{ key, permits, ttl, wait, status }');
  const { key, permits } = options;
  if (typeof key !== 'string' && typeof key !== 'function') {
    throw invalidInput('invalid key: expected a string or a function (req) => string');
  }
  // The count is checked now, as locks.semaphore checks it, and a fixed
  // key with it; a derived key is checked per request.
  locks.semaphore(typeof key === 'string' ? key : 'k', permits);
  const status = options.status ?? 503;
  if (status !== 503 && status !== 429) throw invalidInput(`invalid status: expected 503 or 429, got ${String(status)}`);
  const { ttlMs, waitMs } = routeTiming(options);
  const keyOf = typeof key === 'string' ? () => key : key;
  return { keyOf, permits, ttlMs, waitMs, status, ...answerOptions(options) };
}

/**
 * A middleware that lets at most `permits` requests run the rest of the
 * route at once, across every process on the store: each takes a permit of
 * the semaphore `key` (a string, or `(req) => string`, null or undefined:
 * no limit for this request).
 *
 * - no permit within `wait` (default 0): `status` (503 by default, or 429)
 *   with `Retry-After` and a problem+json body; the route does not run
 * - store down: 503 problem+json; a derived key that is not valid: 400
 * - otherwise `req.permit` is the permit (a Lease with its `slot`),
 *   released when the response ends, the client disconnects, or the
 *   handler's error ends in an error response
 *
 * Throws LEASEHOLD_INVALID_INPUT at once for bad options.
 */
function limitConcurrency(locks, options) {
  const { keyOf, permits, ttlMs, waitMs, status, hintOf, onError } = limitOptions(locks, options);

  function permitThenContinue(req, res, next) {
    return withKey(keyOf, req, next, (key) => {
      let semaphore;
      try {
        semaphore = locks.semaphore(key, permits);
      } catch (error) {
        if (typeof key !== 'string') return next(error);
        return problem.send(res, problem.invalidKey(key, error.message));
      }
      const take = (signal) => semaphore.acquire({ ttl: ttlMs, wait: waitMs, signal });
      const busy = (error) => problem.concurrencyLimit(key, status, hintOf(key, error.retryAfterMs ?? 0));
      return holdForResponse(req, res, next, { key, field: 'permit', take, busy, hintOf, onError });
    });
  }

  return function leaseholdLimitConcurrency(req, res, next) {
    return permitThenContinue(req, res, next);
  };
}

module.exports = { lockRoute, limitConcurrency, problemTypes: problem.TYPES, PROBLEM_CONTENT_TYPE: problem.CONTENT_TYPE };
