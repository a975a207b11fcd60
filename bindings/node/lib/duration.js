'use strict';
// Durations: milliseconds as a number, or a string such as '250ms', '30s',
// '2m', '1h' (one number and one unit).

const { invalidInput } = require('./errors');

const UNIT_MS = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 };
const PATTERN = /^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*$/;

/**
 * The duration `value` in milliseconds. `what` names the option in errors;
 * `allowInfinity` lets a wait be unbounded.
 */
function toMillis(value, what, { allowInfinity = false } = {}) {
  if (typeof value === 'number') {
    if (Number.isNaN(value) || value < 0 || (!Number.isFinite(value) && !allowInfinity)) {
      throw invalidInput(`invalid ${what}: ${value} is not a non-negative number of milliseconds`);
    }
    return value;
  }
  if (typeof value === 'string') {
    const match = PATTERN.exec(value);
    if (!match) {
      throw invalidInput(`invalid ${what}: ${JSON.stringify(value)} is not a duration like '250ms', '30s', '2m' or '1h'`);
    }
    return Number(match[1]) * UNIT_MS[match[2]];
  }
  throw invalidInput(`invalid ${what}: expected milliseconds or a string like '30s', got ${typeof value}`);
}

module.exports = { toMillis };
