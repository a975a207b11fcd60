'use strict';
// Where a native call is answered (src/settle.rs): polled once on the JS
// thread, a call that finishes there returns its value with no thread hop;
// one that must wait moves to the native runtime and returns a promise that
// still settles, is still woken, and can still be cancelled.

const test = require('node:test');
const assert = require('node:assert/strict');
const { NativeLocks } = require('../lib/binding').load();
const { stores, uniqueKey } = require('./stores');

const TTL_MS = 30_000;

test.describe('calls answered on the JS thread (memory store)', () => {
  let locks;
  test.before(async () => {
    locks = await NativeLocks.open('memory://');
  });
  test.after(() => locks.close());

  test('an uncontended acquire and its release return their values, not promises', () => {
    const key = uniqueKey('settle-sync');
    const lease = locks.acquire(key, TTL_MS, 0);
    assert.ok(!(lease instanceof Promise), 'the grant of a free key needs no thread hop');
    assert.equal(lease.key, key);
    const released = lease.release();
    assert.equal(released, true);
    assert.equal(lease.release(), false, 'a second release finds nothing to release');
  });

  test('a busy try throws at once, with the busy code', () => {
    const key = uniqueKey('settle-busy');
    const held = locks.acquire(key, TTL_MS, 0);
    assert.throws(() => locks.acquire(key, TTL_MS, 0), (error) => {
      assert.match(error.message, /LEASEHOLD_BUSY/);
      return true;
    });
    assert.equal(held.release(), true);
  });

  test('a wait behind a holder returns a promise the release settles', async () => {
    const key = uniqueKey('settle-wait');
    const held = locks.acquire(key, TTL_MS, 0);
    const waiting = locks.acquire(key, TTL_MS, 10_000);
    assert.ok(waiting instanceof Promise, 'a wait moves to the native runtime');
    assert.equal(held.release(), true);
    const lease = await waiting;
    assert.equal(lease.key, key);
    assert.ok(lease.token > held.token);
    assert.equal(await lease.release(), true);
  });

  test('a wait that moved to the runtime can still be cancelled', async () => {
    const key = uniqueKey('settle-cancel');
    const held = locks.acquire(key, TTL_MS, 0);
    const id = locks.newCancel();
    const waiting = locks.acquire(key, TTL_MS, 10_000, id);
    setTimeout(() => locks.cancel(id), 20);
    await assert.rejects(waiting, /LEASEHOLD_CANCELLED/);
    assert.equal(held.release(), true);
  });
});

// On a store with I/O the first poll writes the request and the call
// finishes on the runtime: the answer is the same either way.
for (const store of stores()) {
  test(`acquire and release settle on ${store.name}, whichever thread answers`, async () => {
    const locks = await NativeLocks.open(store.url);
    try {
      const key = uniqueKey('settle-store');
      const lease = await locks.acquire(key, TTL_MS, 0);
      assert.equal(lease.key, key);
      await assert.rejects(async () => locks.acquire(key, TTL_MS, 0), /LEASEHOLD_BUSY/);
      assert.equal(await lease.release(), true);
      const again = await locks.acquire(key, TTL_MS, 0);
      assert.ok(again.token > lease.token);
      assert.equal(await again.release(), true);
    } finally {
      await locks.close();
    }
  });
}
