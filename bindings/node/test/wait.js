'use strict';
// Bounded waits of the tests: a failure names what did not happen in time.

/** Resolves with the promise's value, rejects if it takes longer than `ms`. */
function within(promise, ms, what) {
  let timer;
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} not within ${ms} ms`)), ms);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

/**
 * Resolves when `signal` aborts, rejects after `ms`. The timer also keeps
 * the process alive: a lease's signal deliberately does not.
 */
function abortedWithin(signal, ms) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`signal not aborted within ${ms} ms`)), ms);
    signal.addEventListener('abort', () => {
      clearTimeout(timer);
      resolve();
    }, { once: true });
  });
}

module.exports = { within, abortedWithin };
