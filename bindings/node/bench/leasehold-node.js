'use strict';
// leasehold-node's side: the same two measurements as `leasehold bench`'s
// uncontended and hand-off scenarios, through the npm package.

const { setTimeout: sleep } = require('node:timers/promises');
const { Locks } = require('leasehold');
const { timeRounds } = require('./stats');

// As the Rust bench: long enough for the waiter to find the key busy and
// go to sleep before the holder lets go.
const HOLD_BEFORE_RELEASE_MS = 15;

function uniqueKey(what) {
  return `bench-node:${what}:${process.pid}:${Math.random().toString(36).slice(2)}`;
}

/** tryAcquire + release on a free key, `rounds` times. */
async function uncontended(locks, rounds) {
  const key = uniqueKey('uncontended');
  return timeRounds(rounds, async () => {
    const lease = await locks.tryAcquire(key);
    await lease.release();
  });
}

/**
 * From the holder's release call to the waiter (another handle, as another
 * client would be) holding the key: the release, the store's wake-up, the
 * waiter's acquire, and the hop back to the JS thread.
 */
async function handoff(holder, waiter, rounds) {
  const key = uniqueKey('handoff');
  const samples = [];
  for (let i = 0; i < rounds; i += 1) {
    const held = await holder.tryAcquire(key);
    let acquiredAt;
    const waiting = waiter.acquire(key, { wait: '30s' }).then((lease) => {
      acquiredAt = process.hrtime.bigint();
      return lease;
    });
    await sleep(HOLD_BEFORE_RELEASE_MS);
    const releasedAt = process.hrtime.bigint();
    await held.release();
    const next = await waiting;
    samples.push(acquiredAt - releasedAt);
    await next.release();
  }
  return samples;
}

/** Both measurements on the store at `url`. */
async function measure(url, { rounds, handoffRounds, shared }) {
  const locks = await Locks.open(url);
  const waiter = shared ? locks : await Locks.open(url);
  try {
    // Warm-up: connections, prepared statements, the JIT.
    await uncontended(locks, Math.min(50, rounds));
    return {
      uncontended: await uncontended(locks, rounds),
      handoff: await handoff(locks, waiter, handoffRounds),
    };
  } finally {
    await locks.close();
    if (waiter !== locks) await waiter.close();
  }
}

module.exports = { measure, HOLD_BEFORE_RELEASE_MS };
