'use strict';
// Reader-writer locks on every store: readers share, the writer excludes, a
// waiting writer turns new readers away, the with* helpers, cancellation,
// the loss signal, bad input, and that the process exits by itself.

const test = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const path = require('node:path');
const { setTimeout: sleep } = require('node:timers/promises');
const { RwLock } = require('leasehold');
const { uniqueKey, describeEachStore } = require('./stores');
const { within, abortedWithin } = require('./wait');

describeEachStore('rwLock on', (store, pair) => {
  test('readers share, the writer excludes them, tokens increase', async () => {
    const key = uniqueKey('rw');
    const rw = pair.locks.rwLock(key);
    assert.ok(rw instanceof RwLock);
    assert.equal(rw.key, key);
    const r1 = await rw.tryRead({ ttl: '30s' });
    const r2 = await pair.other.rwLock(key).tryRead({ ttl: '30s' });
    assert.notEqual(r1, null);
    assert.notEqual(r2, null);
    assert.equal(await pair.other.rwLock(key).tryWrite(), null, 'readers exclude the writer');
    const holders = await pair.other.rwLock(key).holders();
    assert.deepEqual(holders.map((h) => h.side), ['read', 'read']);
    // One key is one lock: the exclusive acquire of the key is its
    // writer (busy beside readers), and a semaphore of the name is
    // refused at once.
    assert.equal(await pair.other.tryAcquire(key), null, 'readers exclude the exclusive acquire');
    await assert.rejects(pair.other.semaphore(key, 2).acquire({ wait: '20s' }), (e) => {
      assert.equal(e.code, 'LEASEHOLD_KIND_MISMATCH');
      assert.equal(e.retryable, false);
      assert.match(e.message, /is a reader-writer lock; a semaphore of the same name is refused/);
      return true;
    });
    await r1.release();
    await r2.release();
    const w = await pair.other.rwLock(key).tryWrite({ ttl: '30s' });
    assert.ok(w.token > r1.token && w.token > r2.token);
    assert.equal(await rw.tryRead(), null, 'the writer excludes readers');
    assert.deepEqual((await rw.holders()).map((h) => h.side), ['write']);
    await w.release();
    assert.deepEqual(await rw.holders(), []);
  });

  test('a waiting writer is woken by the last reader and turns new readers away', async () => {
    const key = uniqueKey('rw-wait');
    const reader = await pair.locks.rwLock(key).read({ ttl: '30s', wait: 0 });
    const writing = pair.other.rwLock(key).write({ ttl: '30s', wait: '20s' });
    await sleep(200);
    assert.equal(await pair.locks.rwLock(key).tryRead(), null, 'a writer waits: no new reader');
    const releasedAt = Date.now();
    await reader.release();
    const writer = await within(writing, 5000, 'the writer');
    assert.ok(Date.now() - releasedAt < 5000);
    await assert.rejects(pair.locks.rwLock(key).read({ wait: '200ms' }), { code: 'LEASEHOLD_TIMEOUT', retryable: true });
    await writer.release();
  });

  test('withRead and withWrite run fn and always release', async () => {
    const key = uniqueKey('rw-with');
    const rw = pair.locks.rwLock(key);
    assert.equal(await rw.withRead({ wait: '1s' }, async () => (await pair.other.rwLock(key).holders()).length), 1);
    assert.equal(await rw.withWrite({ wait: '1s' }, async (w) => typeof w.token), 'bigint');
    await assert.rejects(rw.withWrite({}, () => { throw new Error('boom'); }), /boom/);
    assert.deepEqual(await rw.holders(), []);
  });

  test('a signal cancels a wait; maxHold ends a grant with LEASEHOLD_LOST', async () => {
    const key = uniqueKey('rw-cancel');
    const writer = await pair.locks.rwLock(key).tryWrite({ ttl: '30s' });
    const controller = new AbortController();
    const waiting = pair.other.rwLock(key).read({ wait: '20s', signal: controller.signal });
    await sleep(100);
    controller.abort();
    await assert.rejects(within(waiting, 2000, 'the cancel'), { code: 'LEASEHOLD_CANCELLED' });
    await writer.release();
    const bounded = await pair.locks.rwLock(key).tryRead({ ttl: '10s', maxHold: '300ms' });
    await abortedWithin(bounded.signal, 10_000);
    assert.equal(bounded.signal.reason.code, 'LEASEHOLD_LOST');
    assert.deepEqual(await pair.other.rwLock(key).holders(), [], 'released at the bound');
  });

  test('bad input throws or rejects with LEASEHOLD_INVALID_INPUT', async () => {
    assert.throws(() => pair.locks.rwLock(''), { code: 'LEASEHOLD_INVALID_INPUT' });
    assert.throws(() => pair.locks.rwLock(3), { code: 'LEASEHOLD_INVALID_INPUT' });
    const rw = pair.locks.rwLock(uniqueKey('rw-bad'));
    for (const call of [
      () => rw.tryRead({ ttl: 'soon' }),
      () => rw.read({ wait: -1 }),
      () => rw.tryWrite({ ttl: '1ms' }),
      () => rw.write({ signal: {} }),
      () => rw.withRead({}, 'not a function'),
      () => rw.withWrite({}, null),
    ]) {
      await assert.rejects(call(), { code: 'LEASEHOLD_INVALID_INPUT', retryable: false }, String(call));
    }
  });
});

test('exits by itself after using a reader-writer lock, a grant still held', () => {
  const child = spawnSync(process.execPath, ['-e', `
    const { Locks } = require('leasehold');
    (async () => {
      const locks = await Locks.open('memory://');
      const rw = locks.rwLock('t');
      const reader = await rw.read({ ttl: '30s', wait: '1s' });
      reader.signal.addEventListener('abort', () => console.log('never'));
      console.log('writer', await rw.tryWrite());
    })();`], { cwd: path.resolve(__dirname, '..'), timeout: 20_000, encoding: 'utf8' });
  assert.equal(child.error, undefined, 'did not exit within 20 s');
  assert.equal(child.stderr, '');
  assert.equal(child.status, 0);
  assert.equal(child.stdout.trim(), 'writer null');
});
