'use strict';
// The README's "Testing your code: memory://" example, as it is written
// there, and its claim that each memory:// Locks is a store of its own.

const test = require('node:test');
const assert = require('node:assert/strict');
const { Locks } = require('leasehold');

// The code under test takes its Locks as a parameter.
async function runNightly(locks, job) {
  return locks.withLock('nightly', { wait: 0 }, () => job());
}

test('a second nightly run while one runs is refused', async (t) => {
  const locks = await Locks.open('memory://');
  t.after(() => locks.close());
  let release;
  const first = runNightly(locks, () => new Promise((resolve) => (release = resolve)));
  await assert.rejects(runNightly(locks, async () => {}), { code: 'LEASEHOLD_BUSY' });
  release();
  await first;
});

test('two memory:// Locks do not share keys', async (t) => {
  const a = await Locks.open('memory://');
  const b = await Locks.open('memory://');
  t.after(() => Promise.all([a.close(), b.close()]));
  const held = await a.acquire('k');
  const other = await b.tryAcquire('k');
  assert.ok(other, 'the second store has its own keys');
  await other.release();
  await held.release();
});
