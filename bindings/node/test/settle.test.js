'use strict';
// Where a native call is answered (src/settle.rs): polled once on the JS
// thread, a call that finishes there returns its value with no thread hop;
// one that must wait moves to the native runtime and returns a promise that
// still settles, is still woken, and can still be cancelled. (Calls that go
// to the network take the second path on every store: api.test.js and the
// other suites make them through the same native methods.)

const test = require('node:test');
const assert = require('node:assert/strict');
const { NativeLocks } = require('../lib/binding').load();
const { uniqueKey } = require('./stores');

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
