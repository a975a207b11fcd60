'use strict';
// OpenTelemetry for a Locks handle, when the application asks for it with
// `Locks.open(url, { telemetry })`: a meter and a tracer of the app's own
// `@opentelemetry/api` (an optional peer dependency, loaded only for
// `telemetry: true`). Names, units and labels are the Rust `metrics`
// feature's (docs/metrics.md), so dashboards fit both. Without the option
// nothing here runs: an acquire pays one `undefined` check.

const { invalidInput } = require('./errors');

const NAME = 'leasehold';
const VERSION = require('../package.json').version;
// SpanStatusCode.ERROR of @opentelemetry/api, a stable enum value; kept
// here so that a meter and tracer handed in need no import of the package.
const STATUS_ERROR = 2;

/** The lock class of a key: up to its first `:`, or `other` (as the Rust core). */
function lockClass(key) {
  const colon = key.indexOf(':');
  return colon > 0 ? key.slice(0, colon) : 'other';
}

/** The lock class of several keys: theirs when they share one, else `other`. */
function lockClassOf(keys) {
  const classes = new Set(keys.map(lockClass));
  return classes.size === 1 ? classes.values().next().value : 'other';
}

/** The outcome label of a failed acquire, from its LEASEHOLD_* code. */
function outcomeOf(error) {
  switch (error?.code) {
    case 'LEASEHOLD_BUSY':
      return 'busy';
    case 'LEASEHOLD_TIMEOUT':
      return 'timeout';
    case 'LEASEHOLD_CANCELLED':
      return 'cancelled';
    default:
      return 'error';
  }
}

/** Loads the app's @opentelemetry/api for `telemetry: true`. */
function globalApi() {
  try {
    return require('@opentelemetry/api');
  } catch (error) {
    throw invalidInput(
      'invalid telemetry: `telemetry: true` uses the global meter and tracer of @opentelemetry/api, ' +
        `which is not installed (npm install @opentelemetry/api), or pass { meter, tracer }: ${error.message}`,
    );
  }
}

function isMeter(value) {
  return typeof value?.createHistogram === 'function' && typeof value?.createObservableCounter === 'function';
}

function isTracer(value) {
  return typeof value?.startSpan === 'function';
}

/**
 * Parses the `telemetry` option: undefined/false (none), true (the global
 * meter and tracer), or { meter?, tracer? }. Throws LEASEHOLD_INVALID_INPUT
 * before any I/O for anything else.
 */
function parseTelemetry(option) {
  if (option === undefined || option === false) return undefined;
  if (option === true) {
    const api = globalApi();
    return { meter: api.metrics.getMeter(NAME, VERSION), tracer: api.trace.getTracer(NAME, VERSION) };
  }
  if (typeof option !== 'object' || option === null) {
    throw invalidInput(`invalid telemetry: expected true, false or { meter, tracer }, got ${option === null ? 'null' : typeof option}`);
  }
  for (const name of Object.keys(option)) {
    if (name !== 'meter' && name !== 'tracer') {
      throw invalidInput(`invalid telemetry: unknown field ${JSON.stringify(name)} (expected meter, tracer)`);
    }
  }
  const { meter, tracer } = option;
  if (meter !== undefined && !isMeter(meter)) {
    throw invalidInput('invalid telemetry.meter: expected an OpenTelemetry Meter (metrics.getMeter(...))');
  }
  if (tracer !== undefined && !isTracer(tracer)) {
    throw invalidInput('invalid telemetry.tracer: expected an OpenTelemetry Tracer (trace.getTracer(...))');
  }
  if (meter === undefined && tracer === undefined) return undefined;
  return { meter, tracer };
}

/**
 * The instruments of one Locks handle. Wait and use times are histograms
 * recorded as they happen; the counts the Rust core keeps (acquisitions by
 * outcome, attempts, renewals, losses, store errors, waiters, held) are
 * observed from `stats()` at each collection, so they cost nothing between
 * collections and agree with `locks.stats()` exactly.
 */
class Telemetry {
  #tracer;
  #waitTime;
  #useTime;
  #observe;
  #meter;
  #store;

  constructor({ meter, tracer }, store, stats) {
    this.#tracer = tracer;
    this.#store = store;
    if (meter === undefined) return;
    this.#meter = meter;
    this.#waitTime = meter.createHistogram('leasehold.lock.wait_time', {
      unit: 's',
      description: 'Time an acquisition waited, from the call to its grant or failure',
    });
    this.#useTime = meter.createHistogram('leasehold.lock.use_time', {
      unit: 's',
      description: 'Time a lease was held, from its grant to its release',
    });
    const acquires = meter.createObservableCounter('leasehold.lock.acquires', {
      description: 'Acquisitions by outcome since the handle was opened',
    });
    const attempts = meter.createObservableCounter('leasehold.lock.attempts', {
      description: 'Store attempts over all acquisitions',
    });
    const renewals = meter.createObservableCounter('leasehold.lock.renewals', { description: 'Lease renewals by outcome' });
    const lost = meter.createObservableCounter('leasehold.lock.lost', { description: 'Leases lost, by reason' });
    const storeErrors = meter.createObservableCounter('leasehold.store.errors', { description: 'Errors the store answered' });
    const pending = meter.createObservableUpDownCounter('leasehold.lock.pending_requests', {
      description: 'Acquisitions waiting now',
    });
    const held = meter.createObservableUpDownCounter('leasehold.lock.held', { description: 'Leases held now' });
    const observables = [acquires, attempts, renewals, lost, storeErrors, pending, held];
    this.#observe = (result) => {
      const s = stats();
      const base = { store: store };
      for (const outcome of ['granted', 'busy', 'timeout', 'cancelled']) {
        result.observe(acquires, s.acquires[outcome], { ...base, outcome });
      }
      result.observe(acquires, s.acquires.failed, { ...base, outcome: 'error' });
      result.observe(attempts, s.attempts, base);
      for (const outcome of ['ok', 'failed', 'unknown']) result.observe(renewals, s.renewals[outcome], { ...base, outcome });
      for (const reason of ['expired', 'gone', 'error']) result.observe(lost, s.lost[reason], { ...base, reason });
      result.observe(storeErrors, s.storeErrors, base);
      result.observe(pending, s.waiting, base);
      result.observe(held, s.held, base);
    };
    meter.addBatchObservableCallback(this.#observe, observables);
    this.observables = observables;
  }

  /**
   * Starts one acquisition of `primitive` on `keys`; the returned function
   * ends it with the lease or the error.
   */
  acquire(primitive, keys) {
    const start = performance.now();
    const attributes = { store: this.#store, primitive, lock_class: lockClassOf(keys) };
    const span = this.#tracer?.startSpan('leasehold.acquire', {
      attributes: { ...attributes, 'leasehold.keys': keys },
    });
    return (error) => {
      const outcome = error === undefined ? 'granted' : outcomeOf(error);
      this.#waitTime?.record((performance.now() - start) / 1000, { ...attributes, outcome });
      if (span !== undefined) {
        span.setAttribute('outcome', outcome);
        if (outcome === 'error') {
          span.recordException(error);
          span.setStatus({ code: STATUS_ERROR, message: error?.message });
        }
        span.end();
      }
      return { attributes, grantedAt: performance.now() };
    };
  }

  /** Starts a release of a lease granted at `grant`; the function ends it. */
  release(grant) {
    this.#useTime?.record((performance.now() - grant.grantedAt) / 1000, grant.attributes);
    const span = this.#tracer?.startSpan('leasehold.release', { attributes: grant.attributes });
    return (error) => {
      if (span === undefined) return;
      span.setAttribute('outcome', error === undefined ? 'ok' : 'error');
      if (error !== undefined) {
        span.recordException(error);
        span.setStatus({ code: STATUS_ERROR, message: error?.message });
      }
      span.end();
    };
  }

  /** Stops observing the handle's counts (its close). */
  close() {
    if (this.#observe !== undefined) this.#meter.removeBatchObservableCallback(this.#observe, this.observables);
    this.#observe = undefined;
  }
}

module.exports = { parseTelemetry, Telemetry, lockClass };
