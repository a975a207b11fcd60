// Types of the public API. The native types it builds on (LeaseInfo, the
// native classes) are generated from the Rust side by `napi build` into
// native.d.ts; `npm test` type-checks both together.
import type { LeaderInfo, LeaseInfo, PermitInfo } from './native';

export type { LeaderInfo, LeaseInfo, PermitInfo };

/** Milliseconds, or a string such as '250ms', '30s', '2m', '1h'. */
export type Duration = number | string;

export type LeaseholdErrorCode =
  | 'LEASEHOLD_BUSY'
  | 'LEASEHOLD_TIMEOUT'
  | 'LEASEHOLD_UNAVAILABLE'
  | 'LEASEHOLD_INVALID_INPUT'
  | 'LEASEHOLD_LOST'
  | 'LEASEHOLD_CANCELLED'
  | 'LEASEHOLD_KIND_MISMATCH';

/**
 * Every error this package rejects or throws with: narrow a `catch (e)`
 * with `e instanceof LeaseholdError` or `isLeaseholdError(e)`.
 */
export declare class LeaseholdError extends Error {
  private constructor();
  code: LeaseholdErrorCode;
  /** Whether the same call may succeed later (busy, timeout, store outage). */
  retryable: boolean;
  /** Busy/timeout: the current holder's label (`host:pid`), when known. */
  holder?: string;
  /** Busy/timeout: the longest the current lease can still last, in ms. */
  retryAfterMs?: number;
}

/** Whether `value` is an error from this package. */
export declare function isLeaseholdError(value: unknown): value is LeaseholdError;

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

export interface LockOptions extends AcquireOptions {
  /**
   * Wait in the key's queue at the store, first come first served across
   * processes, and be handed the key by the release (default false). On a
   * store that keeps queues (memory, SQLite, PostgreSQL, Redis, MongoDB); elsewhere the
   * wait races as without it. See docs/fairness.md.
   */
  fair?: boolean;
}

/** What every grant has: its loss signal, isLost/check, release, dispose. */
declare abstract class Held implements AsyncDisposable {
  /** Aborted, with a LEASEHOLD_LOST error as reason, when the lease is lost. */
  readonly signal: AbortSignal;
  isLost(): boolean;
  /** Throws a LEASEHOLD_LOST error if the lease can no longer be relied on. */
  check(): void;
  /** Releases (idempotent). */
  release(): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
}

export declare class Lease extends Held {
  private constructor();
  readonly key: string;
  /** The fencing token: larger than every earlier grant of this key. */
  readonly token: bigint;
  /** A semaphore permit's slot (0 .. permits-1); undefined for a mutex lease. */
  readonly slot: number | undefined;
}

/** Every key of `acquireMany`; lost (and `signal` aborted) when any key is lost. */
export declare class MultiLease extends Held {
  private constructor();
  /** The keys in canonical (sorted) order, the order they were taken in. */
  readonly keys: string[];
  /** Each key's fencing token. */
  readonly tokens: Map<string, bigint>;
}

/** A term as an election's leader. */
export declare class Leadership extends Held {
  private constructor();
  /** The election's key. */
  readonly key: string;
  /** The id this leader campaigned with. */
  readonly candidate: string;
  /** This term's fencing token: larger than every earlier term's. */
  readonly token: bigint;
  /** Gives leadership up (idempotent). */
  resign(): Promise<void>;
}

/**
 * A `with*` call of a semaphore or reader-writer lock: takes a grant, runs
 * `fn(grant)`, always releases it; rejects with LEASEHOLD_LOST (`fn`'s own
 * error as `cause`) if the grant was lost before `fn` settled. The options
 * may be left out.
 */
export interface WithGrant<G> {
  <T>(fn: (grant: G) => T | Promise<T>): Promise<T>;
  <T>(options: AcquireOptions | undefined, fn: (grant: G) => T | Promise<T>): Promise<T>;
}

/** What every handle a Locks object makes has: its key; only Locks makes one. */
declare abstract class KeyHandle {
  protected constructor();
  /** The key. */
  readonly key: string;
}

/** A semaphore: `permits` holders of `key` at once, across processes. */
export declare class Semaphore extends KeyHandle {
  readonly permits: number;
  tryAcquire(options?: TryAcquireOptions): Promise<Lease | null>;
  acquire(options?: AcquireOptions): Promise<Lease>;
  withPermit: WithGrant<Lease>;
  /** The live permits, by slot. */
  holders(): Promise<PermitInfo[]>;
}

/**
 * A reader-writer lock: shared readers or one writer, each grant a Lease
 * with its own fencing token; a waiting writer is not starved by readers.
 */
export declare class RwLock extends KeyHandle {
  tryRead(options?: TryAcquireOptions): Promise<Lease | null>;
  read(options?: AcquireOptions): Promise<Lease>;
  withRead: WithGrant<Lease>;
  tryWrite(options?: TryAcquireOptions): Promise<Lease | null>;
  write(options?: AcquireOptions): Promise<Lease>;
  withWrite: WithGrant<Lease>;
  /** The live readers and writer (`side` set on each). */
  holders(): Promise<PermitInfo[]>;
}

/** An election: the holder of the key's lease is the leader. */
export declare class Election extends KeyHandle {
  /** Campaigns until elected within `wait` (default: no bound; 0: try once). */
  campaign(candidate: string, options?: AcquireOptions): Promise<Leadership>;
  leader(): Promise<LeaderInfo | null>;
  /**
   * The current leader, then each new term, woken by the store. Ends on
   * `return()` (`break`) and on `locks.close()`.
   */
  observe(): AsyncIterableIterator<LeaderInfo>;
}

export declare class Locks {
  private constructor();
  /**
   * Opens the store named by `url`. `telemetry`: `true` for the global meter
   * and tracer of `@opentelemetry/api` (an optional peer dependency), or
   * your own `{ meter, tracer }`.
   */
  static open(url: string, options?: OpenOptions): Promise<Locks>;
  tryAcquire(key: string, options?: TryAcquireOptions): Promise<Lease | null>;
  acquire(key: string, options?: LockOptions): Promise<Lease>;
  withLock<T>(key: string, fn: (lease: Lease) => T | Promise<T>): Promise<T>;
  withLock<T>(key: string, options: LockOptions | undefined, fn: (lease: Lease) => T | Promise<T>): Promise<T>;
  /** Throws LEASEHOLD_INVALID_INPUT at once for a bad key or `permits` outside 1 to 1024. */
  semaphore(key: string, permits: number): Semaphore;
  acquireMany(keys: string[], options?: LockOptions): Promise<MultiLease>;
  tryAcquireMany(keys: string[], options?: TryAcquireOptions): Promise<MultiLease | null>;
  withLocks<T>(keys: string[], fn: (locks: MultiLease) => T | Promise<T>): Promise<T>;
  withLocks<T>(keys: string[], options: LockOptions | undefined, fn: (locks: MultiLease) => T | Promise<T>): Promise<T>;
  /** Throws LEASEHOLD_INVALID_INPUT at once for a bad key. */
  rwLock(key: string): RwLock;
  /** Throws LEASEHOLD_INVALID_INPUT at once for a bad key. */
  election(key: string): Election;
  inspect(key: string): Promise<LeaseInfo | null>;
  list(prefix?: string): Promise<LeaseInfo[]>;
  forceRelease(key: string): Promise<boolean>;
  /** Counts and quantiles since this handle was opened; no store call. */
  stats(): LocksStats;
  close(): Promise<void>;
}

/** Quantiles of a duration distribution, in ms (each within 12.5 % above the true value; `maxMs` exact). */
export interface DurationQuantiles {
  count: number;
  p50Ms: number;
  p90Ms: number;
  p99Ms: number;
  maxMs: number;
}

/**
 * The parts of an OpenTelemetry `Meter` leasehold uses (a `Meter` of
 * `@opentelemetry/api` fits; declared here so that the types need no
 * import of that optional package).
 */
export interface TelemetryMeter {
  createHistogram(name: string, options?: { unit?: string; description?: string }): {
    record(value: number, attributes?: Record<string, string>): void;
  };
  createObservableCounter(name: string, options?: { unit?: string; description?: string }): object;
  createObservableUpDownCounter(name: string, options?: { unit?: string; description?: string }): object;
  addBatchObservableCallback(callback: (result: any) => void, observables: object[]): void;
  removeBatchObservableCallback(callback: (result: any) => void, observables: object[]): void;
}

/** The parts of an OpenTelemetry `Tracer` leasehold uses. */
export interface TelemetryTracer {
  startSpan(name: string, options?: { attributes?: Record<string, unknown> }): {
    setAttribute(key: string, value: unknown): unknown;
    setStatus(status: { code: number; message?: string }): unknown;
    recordException(exception: unknown): void;
    end(): void;
  };
}

export interface OpenOptions {
  /** OpenTelemetry metrics and spans for this handle (docs: "Telemetry" in README). */
  telemetry?: boolean | { meter?: TelemetryMeter; tracer?: TelemetryTracer };
}

/** `locks.stats()`: what one handle did since it was opened. */
export interface LocksStats {
  /** Acquisitions by how they ended (`cancelled` includes aborted waits). */
  acquires: { granted: number; busy: number; timeout: number; cancelled: number; failed: number };
  /** Attempts at the store over all acquisitions. */
  attempts: number;
  /** Acquisitions waiting now. */
  waiting: number;
  /** Leases held now. */
  held: number;
  renewals: { ok: number; failed: number; unknown: number };
  lost: { expired: number; gone: number; error: number };
  storeErrors: number;
  /** From the acquire call to its end. */
  wait: DurationQuantiles;
  /** From the grant to the release. */
  hold: DurationQuantiles;
}
