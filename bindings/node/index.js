'use strict';
// The public API of `leasehold`: a thin layer over the native addon (found
// by lib/binding.js: a local build or the prebuilt platform package) that
// parses durations, validates input before any I/O, wires AbortSignals, and
// gives errors their `code`.

const { NativeLocks, checkKey: nativeCheckKey, checkSemaphore, DEFAULT_TTL_MS } = require('./lib/binding').load();
const { toMillis } = require('./lib/duration');
const { parseTelemetry, Telemetry } = require('./lib/telemetry');
const { invalidInput, lostError, leaseholdError, native, nativeSync, nullIfBusy, LeaseholdError, isLeaseholdError } = require('./lib/errors');

const LOCKS_TOKEN = Symbol('leasehold.internal');

function checkKey(key) {
  if (typeof key !== 'string') throw invalidInput(`invalid key: expected a string, got ${typeof key}`);
}

function checkKeys(keys) {
  if (!Array.isArray(keys)) throw invalidInput(`invalid keys: expected an array of strings, got ${typeof keys}`);
  for (const key of keys) checkKey(key);
}

function checkOptions(options) {
  if (options === undefined || options === null) return {};
  if (typeof options !== 'object') throw invalidInput(`invalid options: expected an object, got ${typeof options}`);
  return options;
}

function checkSignal(signal) {
  if (signal === undefined || signal === null) return undefined;
  if (!(signal instanceof AbortSignal)) throw invalidInput('invalid signal: expected an AbortSignal');
  return signal;
}

/**
 * What every grant shares: a native lease (one or more renewed leases),
 * its lost-lease signal, isLost/check, release and asyncDispose.
 */
/** The native lease of a Held, for the subclasses (set in Held's static block). */
let nativeOf;
/** Gives a Held its handle's telemetry and grant (set in Held's static block). */
let attachTelemetry;

class Held {
  #native;
  /** Made with the lost-lease watcher, on first need (see #watch). */
  #controller;
  /** The handle's Telemetry and this lease's grant, when the app asked for telemetry. */
  #telemetry;
  #grant;

  constructor(token, nativeLease, maxHoldMs) {
    if (token !== LOCKS_TOKEN) throw new TypeError('leases come from a Locks object');
    this.#native = nativeLease;
    // A hold bound is enforced by the watcher, so it starts at once.
    if (maxHoldMs !== undefined) this.#watch(maxHoldMs);
  }

  static {
    nativeOf = (held) => held.#native;
    attachTelemetry = (held, telemetry, grant) => {
      held.#telemetry = telemetry;
      held.#grant = grant;
    };
  }

  /**
   * Starts the native lost-lease watcher (a task and a threadsafe callback)
   * and returns the controller it aborts. Without a hold bound it starts
   * when `signal` is first read: most leases are released without anyone
   * reading it, and starting it costs every acquire several microseconds.
   * A lease already lost by then is aborted at once.
   */
  #watch(maxHoldMs) {
    const controller = new AbortController();
    this.#controller = controller;
    // The callback captures only the controller and the key, never this
    // object or the native lease, so an abandoned lease can still be
    // garbage-collected (then its renewal stops and it expires).
    const key = this.#native.key;
    const lostAlready = this.#native.watchLost((byBound) => {
      controller.abort(lostError(key, byBound ? 'held longer than maxHold' : undefined));
    }, maxHoldMs);
    if (lostAlready) controller.abort(lostError(key));
    return controller;
  }

  /** Aborted, with a LEASEHOLD_LOST error as its reason, when the lease is lost. */
  get signal() {
    return (this.#controller ?? this.#watch(undefined)).signal;
  }

  /** Whether the lease can no longer be relied on (lost or released). */
  isLost() {
    return this.#native.isLost();
  }

  /** Throws a LEASEHOLD_LOST error if the lease can no longer be relied on. */
  check() {
    nativeSync(() => this.#native.check());
  }

  /** Releases the lease (idempotent). */
  async release() {
    const telemetry = this.#telemetry;
    if (telemetry === undefined) return native(() => this.#native.release());
    // Only the first release is timed: the later ones are no-ops.
    this.#telemetry = undefined;
    const done = telemetry.release(this.#grant);
    try {
      await native(() => this.#native.release());
    } catch (error) {
      done(error);
      throw error;
    }
    done();
  }

  async [Symbol.asyncDispose]() {
    await this.release();
  }
}

/** A held lease (a mutex lease or a semaphore permit), renewed on native threads until released or lost. */
class Lease extends Held {
  /** The locked key. */
  get key() {
    return nativeOf(this).key;
  }

  /** The fencing token (bigint), larger than every earlier grant of this key. */
  get token() {
    return nativeOf(this).token;
  }

  /** A semaphore permit's slot (0 .. permits-1); undefined for a mutex lease. */
  get slot() {
    return nativeOf(this).slot ?? undefined;
  }
}

/** Every key of an acquireMany: aborted/lost as soon as any key is lost. */
class MultiLease extends Held {
  /** The keys, in canonical (sorted) order, the order they were taken in. */
  get keys() {
    return nativeOf(this).keys;
  }

  /** Each key's fencing token (bigint), in canonical order. */
  get tokens() {
    const keys = nativeOf(this).keys;
    const tokens = nativeOf(this).tokens;
    return new Map(keys.map((key, i) => [key, tokens[i]]));
  }
}

/** A term as an election's leader: the lease on the election's key. */
class Leadership extends Held {
  #candidate;

  constructor(token, nativeLease, maxHoldMs, candidate) {
    super(token, nativeLease, maxHoldMs);
    this.#candidate = candidate;
  }

  /** The election's key. */
  get key() {
    return nativeOf(this).key;
  }

  /** The id this leader campaigned with. */
  get candidate() {
    return this.#candidate;
  }

  /** This term's fencing token (bigint): pass it to what the leader writes. */
  get token() {
    return nativeOf(this).token;
  }

  /** Gives leadership up (idempotent): wakes waiting candidates and observers. */
  async resign() {
    await this.release();
  }
}

const ACQUIRE_OPTIONS = ['ttl', 'wait', 'maxHold', 'signal'];
const TRY_OPTIONS = ['ttl', 'maxHold', 'signal'];
/** A mutex wait (acquire, acquireMany and their with* forms) may queue at the store. */
const LOCK_OPTIONS = [...ACQUIRE_OPTIONS, 'fair'];

/**
 * Rejects option names `allowed` does not hold: a misspelt `tll` would
 * otherwise silently mean the default ttl.
 */
function checkKnown(opts, allowed, what) {
  for (const name of Object.keys(opts)) {
    if (!allowed.includes(name)) {
      throw invalidInput(`invalid options: unknown option ${JSON.stringify(name)} for ${what} (expected ${allowed.join(', ')})`);
    }
  }
}

/**
 * The parsed common options of every acquire; `defaultWait` 0 is a try
 * (tryAcquire, tryRead, ...), which never waits and so takes no `wait`.
 */
function acquireOptions(options, defaultWait, what, allowed = ACQUIRE_OPTIONS) {
  const opts = checkOptions(options);
  checkKnown(opts, defaultWait === 0 ? TRY_OPTIONS : allowed, what);
  if (opts.fair !== undefined && typeof opts.fair !== 'boolean') {
    throw invalidInput(`invalid fair: expected true or false, got ${typeof opts.fair}`);
  }
  return {
    fair: opts.fair === true,
    ttlMs: toMillis(opts.ttl ?? DEFAULT_TTL_MS, 'ttl'),
    waitMs: toMillis(opts.wait ?? defaultWait, 'wait', { allowInfinity: true }),
    maxHoldMs: opts.maxHold === undefined ? undefined : toMillis(opts.maxHold, 'maxHold'),
    signal: checkSignal(opts.signal),
  };
}

/**
 * A with* call: takes a grant with `take(options)`, runs `fn(grant)`,
 * always releases it. Rejects with LEASEHOLD_LOST (the callback's own
 * error as `cause`) if the grant was lost before `fn` settled, named in
 * the error by `what(grant)`. The options may be left out
 * (`withLock(key, fn)`).
 */
async function withGrant(options, fn, take, what = (held) => held.key) {
  if (fn === undefined && typeof options === 'function') [options, fn] = [undefined, options];
  if (typeof fn !== 'function') throw invalidInput('invalid fn: expected a function');
  const held = await take(options);
  let result;
  let failure;
  let failed = false;
  try {
    result = await fn(held);
  } catch (error) {
    failed = true;
    failure = error;
  }
  // isLost() covers an aborted signal too (a lease ended by maxHold is
  // released, hence lost); reading `signal` only when lost spares a
  // watcher for the common case.
  const lost = held.isLost();
  // A release that fails leaves the lease to expire after its ttl.
  await held.release().catch(() => {});
  if (lost) {
    const error = held.signal.reason ?? lostError(what(held));
    throw leaseholdError(error.code, error.message, { cause: failed ? failure : undefined });
  }
  if (failed) throw failure;
  return result;
}

/**
 * What every handle a Locks object makes has: its key, and a constructor
 * only Locks calls (`made` tells anyone else how to get one).
 */
class KeyHandle {
  #key;

  constructor(token, key, made) {
    if (token !== LOCKS_TOKEN) throw new TypeError(`use ${made}`);
    this.#key = key;
  }

  /** The key. */
  get key() {
    return this.#key;
  }
}

/** A semaphore: `permits` holders of `key` at once, across processes. */
class Semaphore extends KeyHandle {
  #grant;
  #holders;
  #permits;

  constructor(token, key, permits, grant, holders) {
    super(token, key, 'locks.semaphore(key, permits)');
    this.#permits = permits;
    this.#grant = grant;
    this.#holders = holders;
  }

  /** How many permits this handle counts. */
  get permits() {
    return this.#permits;
  }

  /** Tries once; resolves to a Lease (with its `slot`), or null when every permit is taken. */
  async tryAcquire(options) {
    return nullIfBusy(() => this.#grant(acquireOptions(options, 0, 'tryAcquire'), 0));
  }

  /** Waits up to `wait` (default: no bound) for a permit; rejects with LEASEHOLD_TIMEOUT. */
  async acquire(options) {
    const opts = acquireOptions(options, Infinity, 'acquire');
    return this.#grant(opts, opts.waitMs);
  }

  /** Takes a permit, runs `fn(lease)`, always releases it (as `Locks.withLock`). */
  async withPermit(options, fn) {
    return withGrant(options, fn, (opts) => this.acquire(opts));
  }

  /** The live permits: [{ key, slot, holder, token, expiresInMs }], by slot. */
  async holders() {
    return this.#holders();
  }
}

/**
 * A reader-writer lock on `key`: shared readers or one writer, each grant a
 * Lease with its own fencing token; a waiting writer turns new readers away,
 * so readers do not starve it.
 */
class RwLock extends KeyHandle {
  #grant;
  #holders;

  constructor(token, key, grant, holders) {
    super(token, key, 'locks.rwLock(key)');
    this.#grant = grant;
    this.#holders = holders;
  }

  /** Tries once for a shared grant; resolves to a Lease, or null while a writer holds or waits. */
  async tryRead(options) {
    return this.#try(false, options);
  }

  /** Waits up to `wait` (default: no bound) for a shared grant; rejects with LEASEHOLD_TIMEOUT. */
  async read(options) {
    return this.#wait(false, options);
  }

  /** Takes a shared grant, runs `fn(lease)`, always releases it. */
  async withRead(options, fn) {
    return withGrant(options, fn, (opts) => this.read(opts));
  }

  /** Tries once for the exclusive grant; resolves to a Lease, or null while readers or a writer are there. */
  async tryWrite(options) {
    return this.#try(true, options);
  }

  /** Waits up to `wait` (default: no bound) for the exclusive grant; rejects with LEASEHOLD_TIMEOUT. */
  async write(options) {
    return this.#wait(true, options);
  }

  /** Takes the exclusive grant, runs `fn(lease)`, always releases it. */
  async withWrite(options, fn) {
    return withGrant(options, fn, (opts) => this.write(opts));
  }

  /** The live readers and writer: [{ key, slot, holder, token, expiresInMs, side }]. */
  async holders() {
    return this.#holders();
  }

  async #try(write, options) {
    return nullIfBusy(() => this.#grant(write, acquireOptions(options, 0, write ? 'tryWrite' : 'tryRead'), 0));
  }

  async #wait(write, options) {
    const opts = acquireOptions(options, Infinity, write ? 'write' : 'read');
    return this.#grant(write, opts, opts.waitMs);
  }
}

/** An election on `key`: the holder of its lease is the leader. */
class Election extends KeyHandle {
  #locks;
  #campaign;

  constructor(token, key, nativeLocks, campaign) {
    super(token, key, 'locks.election(key)');
    this.#locks = nativeLocks;
    this.#campaign = campaign;
  }

  /**
   * Campaigns as `candidate` until elected, within `wait` (default: no
   * bound; 0: try once, LEASEHOLD_BUSY while another leads).
   */
  async campaign(candidate, options) {
    if (typeof candidate !== 'string') throw invalidInput(`invalid candidate: expected a string, got ${typeof candidate}`);
    return this.#campaign(candidate, acquireOptions(options, Infinity, 'campaign'));
  }

  /** The current leader, { candidate, token }, or null. */
  async leader() {
    return (await native(() => this.#locks.leader(this.key))) ?? null;
  }

  /**
   * The leaders, as an async iterator of { candidate, token }: the current
   * one first, then each new term, woken by the store. A pending `next()`
   * ends (done) on `return()` (a `break` out of `for await`) and on
   * `locks.close()`; nothing of it keeps the process alive afterwards.
   */
  observe() {
    const nativeLocks = this.#locks;
    const key = this.key;
    let observer;
    let cancelId;
    let done = false;
    const finished = { done: true, value: undefined };
    return {
      [Symbol.asyncIterator]() {
        return this;
      },
      async next() {
        if (done) return finished;
        observer ??= native(() => nativeLocks.observe(key));
        const current = await observer;
        if (done) return finished;
        cancelId = nativeLocks.newCancel();
        const leader = await native(() => current.next(cancelId));
        if (leader === null || leader === undefined || done) {
          done = true;
          observer = undefined; // drops the subscription
          return finished;
        }
        return { done: false, value: leader };
      },
      async return() {
        done = true;
        observer = undefined;
        if (cancelId !== undefined) nativeLocks.cancel(cancelId);
        return finished;
      },
    };
  }
}

/** The `store` label of a URL: its scheme, TLS and SRV variants folded in (`rediss` is `redis`). */
function storeLabel(url) {
  const scheme = url.slice(0, Math.max(0, url.indexOf('://'))).toLowerCase();
  const folded = {
    postgresql: 'postgres',
    rediss: 'redis',
    'redis+unix': 'redis',
    'redis+cluster': 'redis',
    valkey: 'redis',
    valkeys: 'redis',
    'mongodb+srv': 'mongodb',
    etcds: 'etcd',
  };
  return folded[scheme] ?? scheme;
}

/** A store handle. Open one per process with `Locks.open(url)`. */
class Locks {
  #native;
  /** OpenTelemetry instruments (lib/telemetry.js), when `open` was given `telemetry`. */
  #telemetry;

  constructor(token, nativeLocks, telemetry, url) {
    if (token !== LOCKS_TOKEN) throw new TypeError('use Locks.open(url)');
    this.#native = nativeLocks;
    if (telemetry !== undefined) this.#telemetry = new Telemetry(telemetry, storeLabel(url), () => this.stats());
  }

  /**
   * Opens the store named by `url`: memory://, sqlite://PATH, postgres://,
   * redis://, mongodb://, etcd://. `options.telemetry`: true (the global
   * meter and tracer of @opentelemetry/api) or { meter, tracer }.
   */
  static async open(url, options) {
    if (typeof url !== 'string' || url === '') throw invalidInput('invalid store url: expected a non-empty string');
    const opts = checkOptions(options);
    checkKnown(opts, ['telemetry'], 'Locks.open');
    const telemetry = parseTelemetry(opts.telemetry);
    const nativeLocks = await native(() => NativeLocks.open(url));
    return new Locks(LOCKS_TOKEN, nativeLocks, telemetry, url);
  }

  /** Tries once; resolves to a Lease, or null when the key is busy. */
  async tryAcquire(key, options) {
    checkKey(key);
    return nullIfBusy(() => this.#acquire(key, acquireOptions(options, 0, 'tryAcquire'), 0));
  }

  /** Waits up to `wait` (default: no bound) for the key; rejects with LEASEHOLD_TIMEOUT. */
  async acquire(key, options) {
    checkKey(key);
    const opts = acquireOptions(options, Infinity, 'acquire', LOCK_OPTIONS);
    return this.#acquire(key, opts, opts.waitMs);
  }

  #acquire(key, opts, waitMs) {
    return this.#grant(opts, 'mutex', [key], (cancelId) => this.#native.acquire(key, opts.ttlMs, waitMs, cancelId, opts.fair), Lease);
  }

  /**
   * Runs one native acquire (`call(cancelId)`) of `primitive` on `keys`
   * with `opts`' signal wired to its cancellation, and wraps the native
   * lease in `Kind`; timed and traced when the handle has telemetry.
   */
  async #grant(opts, primitive, keys, call, Kind, ...extra) {
    const telemetry = this.#telemetry;
    if (telemetry === undefined) return this.#grantOnce(opts, keys, call, Kind, extra);
    const done = telemetry.acquire(primitive, keys);
    let held;
    try {
      held = await this.#grantOnce(opts, keys, call, Kind, extra);
    } catch (error) {
      done(error);
      throw error;
    }
    attachTelemetry(held, telemetry, done());
    return held;
  }

  async #grantOnce(opts, keys, call, Kind, extra) {
    const signal = opts.signal;
    if (signal?.aborted) {
      // The keys are joined only here, off the path of every acquire.
      const what = keys.join(', ');
      throw leaseholdError('LEASEHOLD_CANCELLED', `waiting for ${JSON.stringify(what)} was cancelled`, { cause: signal.reason });
    }
    let cancelId;
    let onAbort;
    if (signal) {
      cancelId = this.#native.newCancel();
      onAbort = () => this.#native.cancel(cancelId);
      signal.addEventListener('abort', onAbort, { once: true });
    }
    try {
      const nativeLease = await native(() => call(cancelId));
      return new Kind(LOCKS_TOKEN, nativeLease, opts.maxHoldMs, ...extra);
    } finally {
      if (signal) signal.removeEventListener('abort', onAbort);
    }
  }

  /**
   * Acquires `key`, runs `fn(lease)`, always releases. Rejects with
   * LEASEHOLD_LOST (the callback's own error as `cause`) if the lease was
   * lost before `fn` settled.
   */
  async withLock(key, options, fn) {
    return withGrant(options, fn, (opts) => this.acquire(key, opts));
  }

  /**
   * The semaphore `key` with `permits` permits (1 to 1024). Throws
   * LEASEHOLD_INVALID_INPUT at once for a bad key or count.
   */
  semaphore(key, permits) {
    checkKey(key);
    if (!Number.isInteger(permits) || permits < 1 || permits > 0xffff_ffff) {
      throw invalidInput(`invalid permits: expected an integer of at least 1, got ${String(permits)}`);
    }
    nativeSync(() => checkSemaphore(key, permits));
    const grant = (opts, waitMs) =>
      this.#grant(opts, 'semaphore', [key], (cancelId) => this.#native.acquirePermit(key, permits, opts.ttlMs, waitMs, cancelId), Lease);
    const holders = () => native(() => this.#native.holders(key, permits));
    return new Semaphore(LOCKS_TOKEN, key, permits, grant, holders);
  }

  /**
   * Takes every key or none, in canonical (sorted) order, waiting up to
   * `wait` (default: no bound) in all; rejects with LEASEHOLD_TIMEOUT.
   */
  async acquireMany(keys, options) {
    checkKeys(keys);
    const opts = acquireOptions(options, Infinity, 'acquireMany', LOCK_OPTIONS);
    return this.#acquireMany(keys, opts, opts.waitMs);
  }

  /** Tries once to take every key; resolves to a MultiLease, or null when any key is busy. */
  async tryAcquireMany(keys, options) {
    checkKeys(keys);
    return nullIfBusy(() => this.#acquireMany(keys, acquireOptions(options, 0, 'tryAcquireMany'), 0));
  }

  #acquireMany(keys, opts, waitMs) {
    return this.#grant(opts, 'multi', keys, (cancelId) => this.#native.acquireMany(keys, opts.ttlMs, waitMs, cancelId, opts.fair), MultiLease);
  }

  /** Takes every key, runs `fn(multiLease)`, always releases (as `withLock`). */
  async withLocks(keys, options, fn) {
    return withGrant(options, fn, (opts) => this.acquireMany(keys, opts), () => keys.join(', '));
  }

  /** The reader-writer lock `key`. Throws LEASEHOLD_INVALID_INPUT at once for a bad key. */
  rwLock(key) {
    checkKey(key);
    nativeSync(() => nativeCheckKey(key));
    const grant = (write, opts, waitMs) =>
      this.#grant(opts, 'rwlock', [key], (cancelId) => this.#native.acquireRw(key, write, opts.ttlMs, waitMs, cancelId), Lease);
    const holders = () => native(() => this.#native.rwHolders(key));
    return new RwLock(LOCKS_TOKEN, key, grant, holders);
  }

  /** The election on `key`. Throws LEASEHOLD_INVALID_INPUT at once for a bad key. */
  election(key) {
    checkKey(key);
    nativeSync(() => nativeCheckKey(key));
    const campaign = (candidate, opts) =>
      this.#grant(
        opts,
        'election',
        [key],
        (cancelId) => this.#native.campaign(key, candidate, opts.ttlMs, opts.waitMs, cancelId),
        Leadership,
        candidate,
      );
    return new Election(LOCKS_TOKEN, key, this.#native, campaign);
  }

  /** The current lease of `key`: null or { key, holder, token, expiresInMs }. */
  async inspect(key) {
    checkKey(key);
    return (await native(() => this.#native.inspect(key))) ?? null;
  }

  /** Every live lease whose key starts with `prefix` (default: all). */
  async list(prefix = '') {
    if (typeof prefix !== 'string') throw invalidInput(`invalid prefix: expected a string, got ${typeof prefix}`);
    return native(() => this.#native.list(prefix));
  }

  /**
   * What this handle did since it was opened, without any store call:
   * acquisitions by outcome, attempts, leases held and waiters now,
   * renewals, lost leases, store errors, and wait/hold quantiles in ms.
   */
  stats() {
    return nativeSync(() => this.#native.stats());
  }

  /** Breaks whoever holds `key`; true if there was a lease. */
  async forceRelease(key) {
    checkKey(key);
    return native(() => this.#native.forceRelease(key));
  }

  /** Ends pending waits and releases every lease of this handle. */
  async close() {
    this.#telemetry?.close();
    await native(() => this.#native.close());
  }
}

module.exports = { Locks, Lease, MultiLease, Leadership, Semaphore, RwLock, Election, LeaseholdError, isLeaseholdError };
