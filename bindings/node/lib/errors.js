'use strict';
// Errors with a `code`: the native side rejects with a tagged JSON record
// (napi-rs cannot give an async rejection its own code); here it becomes a
// plain `Error` created on the JS side, so it carries the caller's stack.

const TAG = 'LEASEHOLD_ERROR:';

/**
 * Every error this package throws or rejects with: `catch (e)` code can
 * test `e instanceof LeaseholdError` or `isLeaseholdError(e)` and read
 * `e.code` without a cast.
 */
class LeaseholdError extends Error {
  get name() {
    return 'LeaseholdError';
  }
}

/** Whether `value` is an error from this package (also one from another copy of it). */
function isLeaseholdError(value) {
  return (
    value instanceof LeaseholdError ||
    (value instanceof Error && typeof value.code === 'string' && value.code.startsWith('LEASEHOLD_') && typeof value.retryable === 'boolean')
  );
}

/** A LeaseholdError with the fields every leasehold error has. */
function leaseholdError(code, message, extra = {}) {
  const error = new LeaseholdError(message);
  error.code = code;
  error.retryable = Boolean(extra.retryable);
  if (extra.holder !== undefined) error.holder = extra.holder;
  if (extra.retryAfterMs !== undefined) error.retryAfterMs = extra.retryAfterMs;
  if (extra.cause !== undefined) error.cause = extra.cause;
  return error;
}

/** Bad input, rejected before any I/O. */
function invalidInput(message) {
  return leaseholdError('LEASEHOLD_INVALID_INPUT', message);
}

/** The error a lost lease's signal is aborted with. */
function lostError(key, why) {
  return leaseholdError('LEASEHOLD_LOST', `the lease on ${JSON.stringify(key)} was lost${why ? `: ${why}` : ''}`);
}

/** A native error turned into a leasehold error; anything else as it is. */
function translate(error) {
  const text = error && typeof error.message === 'string' ? error.message : '';
  if (!text.startsWith(TAG)) return error;
  let record;
  try {
    record = JSON.parse(text.slice(TAG.length));
  } catch {
    return error;
  }
  return leaseholdError(record.code, record.message, record);
}

/** Runs `fn` (sync or async) and rethrows native errors translated. */
async function native(fn) {
  try {
    return await fn();
  } catch (error) {
    throw translate(error);
  }
}

/** The sync form of `native`. */
function nativeSync(fn) {
  try {
    return fn();
  } catch (error) {
    throw translate(error);
  }
}

/**
 * Runs one try of an acquisition (`attempt()`, a promise of a grant):
 * resolves to null when the key is busy, as every `try*` method answers;
 * any other failure rejects as it is.
 */
async function nullIfBusy(attempt) {
  try {
    return await attempt();
  } catch (error) {
    if (error.code === 'LEASEHOLD_BUSY') return null;
    throw error;
  }
}

module.exports = { LeaseholdError, isLeaseholdError, leaseholdError, invalidInput, lostError, translate, native, nativeSync, nullIfBusy };
