// Types of the public API. The native types it builds on (LeaseInfo, the
// native classes) are generated from the Rust side by `napi build` into
// native.d.ts; `npm test` type-checks both together.
import type { LeaseInfo } from './native';

export type { LeaseInfo };

/** Milliseconds, or a string such as '250ms', '30s', '2m', '1h'. */
export type Duration = number | string;

export type LeaseholdErrorCode =
  | 'LEASEHOLD_BUSY'
  | 'LEASEHOLD_TIMEOUT'
  | 'LEASEHOLD_UNAVAILABLE'
  | 'LEASEHOLD_INVALID_INPUT'
  | 'LEASEHOLD_LOST'
  | 'LEASEHOLD_CANCELLED';

/** Every error this package rejects or throws with. */
export interface LeaseholdError extends Error {
  code: LeaseholdErrorCode;
  /** Whether the same call may succeed later (busy, timeout, store outage). */
  retryable: boolean;
  /** Busy/timeout: the current holder's label (`host:pid`), when known. */
  holder?: string;
  /** Busy/timeout: the longest the current lease can still last, in ms. */
  retryAfterMs?: number;
}

export interface AcquireOptions {
  /** Lease length, 100 ms to 24 h (default 30 s); renewed every ttl/3. */
  ttl?: Duration;
  /** How long `acquire` waits for a busy key (default: no bound; `Infinity` too). */
  wait?: Duration;
  /** Cancels the wait (rejects with LEASEHOLD_CANCELLED). */
  signal?: AbortSignal;
  /** Bounds the total holding time: the lease is released and reported lost after it. */
  maxHold?: Duration;
}

export type TryAcquireOptions = Omit<AcquireOptions, 'wait'>;

export declare class Lease implements AsyncDisposable {
  private constructor();
  readonly key: string;
  /** The fencing token: larger than every earlier grant of this key. */
  readonly token: bigint;
  /** Aborted, with a LEASEHOLD_LOST error as reason, when the lease is lost. */
  readonly signal: AbortSignal;
  isLost(): boolean;
  /** Throws a LEASEHOLD_LOST error if the lease can no longer be relied on. */
  check(): void;
  release(): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
}

export declare class Locks {
  private constructor();
  static open(url: string): Promise<Locks>;
  tryAcquire(key: string, options?: TryAcquireOptions): Promise<Lease | null>;
  acquire(key: string, options?: AcquireOptions): Promise<Lease>;
  withLock<T>(key: string, options: AcquireOptions | undefined, fn: (lease: Lease) => T | Promise<T>): Promise<T>;
  inspect(key: string): Promise<LeaseInfo | null>;
  list(prefix?: string): Promise<LeaseInfo[]>;
  forceRelease(key: string): Promise<boolean>;
  close(): Promise<void>;
}
