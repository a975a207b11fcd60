// Types of `leasehold/express`. They use only Node's own `http` types, so
// they need neither Express nor its types; with `@types/express` installed
// the middleware fits `app.post(path, lockRoute(...), handler)` and
// `req.lease` is typed on Express's `Request`.
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Duration, Lease, LeaseholdError, Locks } from './index';

/** What a `retryAfter` function is told about a refused request. */
export interface RetryAfterInfo {
  key: string;
  /** The longest the holder's lease can still last (the default hint). */
  holderRemainingMs: number;
}

/** The busy answer's hint (`Retry-After`, `retryAfterMs`): a duration, or a function of the refusal. */
export type RetryAfter = Duration | ((info: RetryAfterInfo) => Duration);

/**
 * The request as the key function sees it: Node's `IncomingMessage` plus
 * whatever the framework added (`params`, `body`, ...). Annotate the key
 * function's parameter (e.g. with Express's `Request`) for exact types.
 */
export type LockRouteRequest = IncomingMessage & { [field: string]: any };

export interface LockRouteOptions<Req extends IncomingMessage = LockRouteRequest> {
  /**
   * The lock key for a request (a string of 1 to 256 bytes), or null or
   * undefined to let the request through without a lock. A function that
   * throws (or rejects) passes its error to `next`.
   */
  key: (req: Req) => string | null | undefined | Promise<string | null | undefined>;
  /** Lease length, 100 ms to 24 h (default 30 s); renewed while the handler runs. */
  ttl?: Duration;
  /** How long a request waits for a busy key before the 409 (default 0, at most 24 h). */
  wait?: Duration;
  /** Replaces the holder's remaining ttl as the busy answer's hint, e.g. '1s' or ({ holderRemainingMs }) => Math.min(holderRemainingMs, 2000). */
  retryAfter?: RetryAfter;
  /** Hears every store failure (503) and invalid derived key (400) the middleware answers itself. */
  onError?: (error: LeaseholdError, req: Req) => void;
}

/** A Connect-style middleware; it also returns a promise for frameworks that await it. */
export type LockRouteMiddleware<Req extends IncomingMessage = LockRouteRequest> = (
  req: Req,
  res: ServerResponse,
  next: (error?: unknown) => void,
) => Promise<void>;

/**
 * Runs the rest of the route under a lease on `options.key(req)`: 409 with
 * `Retry-After` and a problem+json body while another request holds it, 503
 * when the store is down, otherwise `req.lease` for the handler, released
 * when the response ends or the client disconnects.
 * Throws LEASEHOLD_INVALID_INPUT at once for bad options.
 */
export declare function lockRoute<Req extends IncomingMessage = LockRouteRequest>(
  locks: Locks,
  options: LockRouteOptions<Req>,
): LockRouteMiddleware<Req>;

export interface LimitConcurrencyOptions<Req extends IncomingMessage = LockRouteRequest> {
  /**
   * The semaphore's key: one string for the route, or a function of the
   * request (null or undefined: no limit for this request).
   */
  key: string | ((req: Req) => string | null | undefined | Promise<string | null | undefined>);
  /** How many requests may run at once, across every process (1 to 1024). */
  permits: number;
  /** Permit lease length, 100 ms to 24 h (default 30 s); renewed while the handler runs. */
  ttl?: Duration;
  /** How long a request waits for a permit (default 0, at most 24 h). */
  wait?: Duration;
  /** Replaces the holder's remaining ttl as the busy answer's hint, e.g. '1s' or ({ holderRemainingMs }) => Math.min(holderRemainingMs, 2000). */
  retryAfter?: RetryAfter;
  /** Hears every store failure (503) and invalid derived key (400) the middleware answers itself. */
  onError?: (error: LeaseholdError, req: Req) => void;
  /** The answer when no permit came: 503 (default) or 429. */
  status?: 503 | 429;
}

/**
 * Lets at most `permits` requests run the rest of the route at once across
 * every process: `status` (503 or 429) with `Retry-After` and a
 * problem+json body when no permit came within `wait`, 503 when the store
 * is down, otherwise `req.permit` for the handler, released when the
 * response ends, the client disconnects or the handler's error is answered.
 * Throws LEASEHOLD_INVALID_INPUT at once for bad options.
 */
export declare function limitConcurrency<Req extends IncomingMessage = LockRouteRequest>(
  locks: Locks,
  options: LimitConcurrencyOptions<Req>,
): LockRouteMiddleware<Req>;

/** `type` URIs of the problem documents: the Rust layer's (`leasehold::http::problem`). */
export declare const problemTypes: {
  readonly locked: 'tag:leasehold,2025:locked';
  readonly storeUnavailable: 'tag:leasehold,2025:store-unavailable';
  readonly invalidKey: 'tag:leasehold,2025:invalid-lock-key';
  readonly concurrencyLimit: 'tag:leasehold,2025:concurrency-limit';
};

/** `application/problem+json`. */
export declare const PROBLEM_CONTENT_TYPE: 'application/problem+json';

/** The body of an answer `lockRoute` or `limitConcurrency` writes itself (RFC 9457). */
export interface LockRouteProblem {
  type: string;
  title: string;
  status: 409 | 503 | 429 | 400;
  detail: string;
  /** The lock key (escaped in a 400). */
  key: string;
  /** 409, and the limiter's 503 or 429: the wait hint (by default the longest the holder's lease, or the first permit, can still last); a store's 503: 1000 when worth retrying. */
  retryAfterMs?: number;
  /** The same as `retryAfterMs`, under the Rust layer's name. */
  retry_after_ms?: number;
}

declare global {
  // Express's `Request` extends this global interface (as passport's and
  // express-session's fields do), so `req.lease` is typed in handlers.
  // eslint-disable-next-line @typescript-eslint/no-namespace
  namespace Express {
    interface Request {
      /** The lease `lockRoute` holds for this request. */
      lease?: Lease;
      /** The semaphore permit `limitConcurrency` holds for this request. */
      permit?: Lease;
    }
  }
}
