'use strict';
// locks.stats(): the Rust handle's counters and quantiles, read without a
// store call.

const test = require('node:test');
const assert = require('node:assert/strict');
const { Locks } = require('leasehold');

test('stats() counts grants, busy answers, timeouts and holds since open', async () => {
  const locks = await Locks.open('memory://');
  try {
    const fresh = locks.stats();
    assert.equal(fresh.acquires.granted, 0);
    assert.equal(fresh.wait.count, 0);

    const lease = await locks.tryAcquire('stats:a', { ttl: '30s' });
    assert.equal(await locks.tryAcquire('stats:a'), null);
    await assert.rejects(locks.acquire('stats:a', { wait: 60 }), { code: 'LEASEHOLD_TIMEOUT' });
    const during = locks.stats();
    assert.deepEqual(
      { granted: during.acquires.granted, busy: during.acquires.busy, timeout: during.acquires.timeout },
      { granted: 1, busy: 1, timeout: 1 },
    );
    assert.equal(during.held, 1);
    assert.equal(during.waiting, 0);
    assert.ok(during.wait.maxMs >= 60, `the timeout waited: ${during.wait.maxMs}`);
    await lease.release();

    const after = locks.stats();
    assert.equal(after.held, 0);
    assert.equal(after.hold.count, 1);
    assert.ok(after.attempts >= 3);
    assert.equal(typeof after.storeErrors, 'number');
  } finally {
    await locks.close();
  }
});
