'use strict';
// Semaphores, several keys at once and elections, on every store: grants,
// busy and waits, bad input, the loss signal on force-release, cancellation,
// the with* helpers, dispose, and close().

const test = require('node:test');
const assert = require('node:assert/strict');
const { setTimeout: sleep } = require('node:timers/promises');
const { Locks, Lease, MultiLease, Leadership } = require('leasehold');
const { serverStores, uniqueKey, describeEachStore, sqlitePair } = require('./stores');
const { within, abortedWithin } = require('./wait');
const { relay } = require('./proxy');

describeEachStore('on', (store, pair) => {
  // ---- semaphores ----

  test('semaphore: permits up to the count, each with a slot, then null', async () => {
    const key = uniqueKey('sem');
    const sem = pair.locks.semaphore(key, 2);
    assert.equal(sem.key, key);
    assert.equal(sem.permits, 2);
    const a = await sem.tryAcquire({ ttl: '30s' });
    const b = await pair.other.semaphore(key, 2).tryAcquire({ ttl: '30s' });
    assert.ok(a instanceof Lease && b instanceof Lease);
    assert.deepEqual([a.slot, b.slot].sort(), [0, 1]);
    assert.equal(typeof a.token, 'bigint');
    assert.equal(a.key, key);
    assert.equal(await sem.tryAcquire(), null, 'both permits taken');
    const holders = await pair.other.semaphore(key, 2).holders();
    assert.deepEqual(holders.map((h) => h.slot), [0, 1]);
    assert.equal(holders[a.slot].token, a.token);
    assert.equal(typeof holders[0].holder, 'string');
    assert.ok(holders[0].expiresInMs > 0 && holders[0].expiresInMs <= 30_000);
    // One key is one lock: a mutex of the semaphore's name is refused at
    // once (not waited on), with a code of its own.
    await assert.rejects(pair.locks.acquire(key, { wait: '20s' }), (e) => {
      assert.equal(e.code, 'LEASEHOLD_KIND_MISMATCH');
      assert.equal(e.retryable, false);
      assert.match(e.message, /is a semaphore; a mutex of the same name is refused: use another key/);
      return true;
    });
    await a.release();
    const c = await sem.tryAcquire();
    assert.equal(c.slot, a.slot, 'the freed slot is taken again');
    await b.release();
    await c.release();
    assert.deepEqual(await sem.holders(), []);
  });

  test('semaphore: acquire waits for a release, times out with holder and retryAfterMs', async () => {
    const key = uniqueKey('sem-wait');
    const sem = pair.locks.semaphore(key, 1);
    const first = await sem.acquire({ ttl: '30s', wait: 0 });
    await assert.rejects(pair.other.semaphore(key, 1).acquire({ wait: '200ms' }), (e) => {
      assert.equal(e.code, 'LEASEHOLD_TIMEOUT');
      assert.equal(e.retryable, true);
      assert.equal(typeof e.holder, 'string');
      assert.ok(e.retryAfterMs > 0 && e.retryAfterMs <= 30_000, String(e.retryAfterMs));
      return true;
    });
    const waiting = pair.other.semaphore(key, 1).acquire({ ttl: '5s', wait: '20s' });
    await sleep(100);
    const releasedAt = Date.now();
    await first.release();
    const second = await waiting;
    assert.ok(Date.now() - releasedAt < 5000, 'woken by the release, not the ttl');
    assert.equal(second.slot, 0);
    await second.release();
  });

  test('semaphore: a signal cancels the wait; an aborted one rejects at once', async () => {
    const key = uniqueKey('sem-cancel');
    const held = await pair.locks.semaphore(key, 1).tryAcquire({ ttl: '30s' });
    const controller = new AbortController();
    const waiting = pair.other.semaphore(key, 1).acquire({ wait: '20s', signal: controller.signal });
    await sleep(100);
    const abortedAt = Date.now();
    controller.abort();
    await assert.rejects(waiting, { code: 'LEASEHOLD_CANCELLED', retryable: false });
    assert.ok(Date.now() - abortedAt < 2000);
    await assert.rejects(pair.other.semaphore(key, 1).acquire({ signal: AbortSignal.abort() }), { code: 'LEASEHOLD_CANCELLED' });
    await held.release();
  });

  test('semaphore: maxHold ends a permit, its signal aborts with LEASEHOLD_LOST', async () => {
    const key = uniqueKey('sem-max-hold');
    const permit = await pair.locks.semaphore(key, 2).tryAcquire({ ttl: '10s', maxHold: '300ms' });
    await abortedWithin(permit.signal, 10_000);
    assert.equal(permit.signal.reason.code, 'LEASEHOLD_LOST');
    assert.equal(permit.isLost(), true);
    assert.throws(() => permit.check(), { code: 'LEASEHOLD_LOST' });
    assert.deepEqual(await pair.other.semaphore(key, 2).holders(), [], 'released at the bound');
  });

  test('semaphore: withPermit runs fn and always releases; asyncDispose releases', async () => {
    const key = uniqueKey('sem-with');
    const sem = pair.locks.semaphore(key, 1);
    const result = await sem.withPermit({ ttl: '10s', wait: '1s' }, async (permit) => {
      assert.equal(permit.slot, 0);
      assert.equal((await pair.other.semaphore(key, 1).holders()).length, 1);
      return 'done';
    });
    assert.equal(result, 'done');
    assert.deepEqual(await sem.holders(), []);
    await assert.rejects(sem.withPermit({}, () => { throw new Error('boom'); }), /boom/);
    assert.deepEqual(await sem.holders(), []);
    const permit = await sem.tryAcquire({ ttl: '30s' });
    await permit[Symbol.asyncDispose]();
    assert.deepEqual(await sem.holders(), []);
    assert.equal(permit.signal.aborted, false, 'a release is not a loss');
  });

  test('semaphore: bad input throws or rejects with LEASEHOLD_INVALID_INPUT', async () => {
    for (const call of [
      () => pair.locks.semaphore('', 2),
      () => pair.locks.semaphore(7, 2),
      () => pair.locks.semaphore('k', 0),
      () => pair.locks.semaphore('k', 1.5),
      () => pair.locks.semaphore('k', '2'),
      () => pair.locks.semaphore('k', 1025),
      () => pair.locks.semaphore('k', 2 ** 40),
    ]) {
      assert.throws(call, { code: 'LEASEHOLD_INVALID_INPUT', retryable: false }, String(call));
    }
    const sem = pair.locks.semaphore(uniqueKey('sem-bad'), 2);
    for (const call of [
      () => sem.tryAcquire({ ttl: 'soon' }),
      () => sem.tryAcquire({ ttl: '1ms' }),
      () => sem.acquire({ wait: -1 }),
      () => sem.acquire({ signal: {} }),
      () => sem.acquire('options'),
      () => sem.withPermit({}, 'not a function'),
    ]) {
      await assert.rejects(call(), { code: 'LEASEHOLD_INVALID_INPUT', retryable: false }, String(call));
    }
  });

  // ---- several keys at once ----

  test('acquireMany takes every key or none, tokens per key', async () => {
    const prefix = uniqueKey('multi');
    const keys = [`${prefix}:b`, `${prefix}:a`, `${prefix}:c`];
    const multi = await pair.locks.acquireMany(keys, { ttl: '30s', wait: '1s' });
    assert.ok(multi instanceof MultiLease);
    assert.deepEqual(multi.keys, [...keys].sort(), 'canonical order');
    assert.ok(multi.tokens instanceof Map);
    for (const key of keys) {
      const info = await pair.other.inspect(key);
      assert.equal(multi.tokens.get(key), info.token);
      assert.equal(typeof info.token, 'bigint');
    }
    assert.equal(multi.isLost(), false);
    multi.check();
    // One key busy: the whole set is busy, and nothing is left taken.
    assert.equal(await pair.other.tryAcquireMany([`${prefix}:z`, `${prefix}:a`]), null);
    assert.equal(await pair.other.inspect(`${prefix}:z`), null, 'the free key was handed back');
    await multi.release();
    for (const key of keys) assert.equal(await pair.other.inspect(key), null);
    const again = await pair.other.tryAcquireMany(keys);
    assert.ok(again.tokens.get(keys[0]) > multi.tokens.get(keys[0]));
    await again.release();
  });

  test('acquireMany waits for a busy key, times out and is cancelled', async () => {
    const prefix = uniqueKey('multi-wait');
    const held = await pair.locks.tryAcquire(`${prefix}:b`, { ttl: '30s' });
    await assert.rejects(pair.other.acquireMany([`${prefix}:a`, `${prefix}:b`], { wait: '200ms' }), {
      code: 'LEASEHOLD_TIMEOUT',
      retryable: true,
    });
    assert.equal(await pair.other.inspect(`${prefix}:a`), null, 'nothing kept after a timeout');
    const controller = new AbortController();
    const cancelled = pair.other.acquireMany([`${prefix}:a`, `${prefix}:b`], { wait: '20s', signal: controller.signal });
    await sleep(100);
    controller.abort();
    await assert.rejects(within(cancelled, 2000, 'cancel'), { code: 'LEASEHOLD_CANCELLED' });
    const waiting = pair.other.acquireMany([`${prefix}:a`, `${prefix}:b`], { ttl: '5s', wait: '20s' });
    await sleep(100);
    await held.release();
    const multi = await within(waiting, 5000, 'the wake-up');
    assert.deepEqual(multi.keys, [`${prefix}:a`, `${prefix}:b`]);
    await multi.release();
  });

  test('a MultiLease signal aborts when any one key is force-released', async () => {
    const prefix = uniqueKey('multi-lost');
    const multi = await pair.locks.acquireMany([`${prefix}:a`, `${prefix}:b`], { ttl: 900 });
    const aborted = abortedWithin(multi.signal, 10_000);
    assert.equal(await pair.other.forceRelease(`${prefix}:b`), true);
    await aborted;
    assert.equal(multi.signal.reason.code, 'LEASEHOLD_LOST');
    assert.equal(multi.isLost(), true);
    assert.throws(() => multi.check(), { code: 'LEASEHOLD_LOST' });
    await multi.release();
    assert.equal(await pair.other.inspect(`${prefix}:a`), null, 'the other key is released too');
  });

  test('withLocks runs fn under every key and always releases', async () => {
    const prefix = uniqueKey('multi-with');
    const keys = [`${prefix}:a`, `${prefix}:b`];
    const n = await pair.locks.withLocks(keys, { ttl: '10s', wait: '1s' }, async (multi) => {
      assert.notEqual(await pair.other.inspect(keys[1]), null);
      return multi.tokens.size;
    });
    assert.equal(n, 2);
    for (const key of keys) assert.equal(await pair.other.inspect(key), null);
    await assert.rejects(pair.locks.withLocks(keys, {}, () => { throw new Error('boom'); }), /boom/);
    for (const key of keys) assert.equal(await pair.other.inspect(key), null);
    const multi = await pair.locks.tryAcquireMany(keys);
    await multi[Symbol.asyncDispose]();
    for (const key of keys) assert.equal(await pair.other.inspect(key), null);
  });

  test('acquireMany: bad input rejects with LEASEHOLD_INVALID_INPUT', async () => {
    const many = Array.from({ length: 257 }, (_, i) => `k${i}`);
    for (const call of [
      () => pair.locks.acquireMany('k'),
      () => pair.locks.acquireMany([]),
      () => pair.locks.acquireMany(['a', 'a']),
      () => pair.locks.acquireMany(['a', '']),
      () => pair.locks.acquireMany(['a', 3]),
      () => pair.locks.acquireMany(many),
      () => pair.locks.tryAcquireMany(['a'], { ttl: 'soon' }),
      () => pair.locks.acquireMany(['a'], { signal: {} }),
      () => pair.locks.withLocks(['a'], {}, null),
    ]) {
      await assert.rejects(call(), { code: 'LEASEHOLD_INVALID_INPUT', retryable: false }, String(call));
    }
    assert.equal(await pair.locks.inspect('a'), null);
  });

  // ---- elections ----

  test('election: campaign, leader, resign and the next candidate', async () => {
    const key = uniqueKey('elect');
    const election = pair.locks.election(key);
    assert.equal(election.key, key);
    assert.equal(await election.leader(), null);
    const term = await election.campaign('node-1', { ttl: '30s' });
    assert.ok(term instanceof Leadership);
    assert.equal(term.candidate, 'node-1');
    assert.equal(term.key, key);
    assert.equal(typeof term.token, 'bigint');
    assert.deepEqual(await pair.other.election(key).leader(), { candidate: 'node-1', token: term.token });
    await assert.rejects(pair.other.election(key).campaign('node-2', { wait: 0 }), { code: 'LEASEHOLD_BUSY' });
    const next = pair.other.election(key).campaign('node-2', { ttl: '30s', wait: '20s' });
    await sleep(100);
    await term.resign();
    await term.resign(); // idempotent
    const second = await within(next, 5000, 'the next term');
    assert.ok(second.token > term.token);
    assert.equal((await election.leader()).candidate, 'node-2');
    await second[Symbol.asyncDispose]();
    assert.equal(await election.leader(), null);
  });

  test('election: a deposed leader signal aborts; a cancelled campaign rejects', async () => {
    const key = uniqueKey('elect-lost');
    const term = await pair.locks.election(key).campaign('node-1', { ttl: 900 });
    const aborted = abortedWithin(term.signal, 10_000);
    const controller = new AbortController();
    const campaign = pair.other.election(key).campaign('node-2', { wait: '20s', signal: controller.signal });
    await sleep(50);
    controller.abort();
    await assert.rejects(within(campaign, 2000, 'cancel'), { code: 'LEASEHOLD_CANCELLED' });
    assert.equal(await pair.other.forceRelease(key), true);
    await aborted;
    assert.equal(term.signal.reason.code, 'LEASEHOLD_LOST');
    assert.equal(term.isLost(), true);
    await term.resign();
  });

  test('election: observe yields the current leader, then each new term, until break', async () => {
    const key = uniqueKey('observe');
    const election = pair.other.election(key);
    const seen = [];
    const first = await pair.locks.election(key).campaign('node-1', { ttl: '30s' });
    const watching = (async () => {
      for await (const leader of election.observe()) {
        seen.push(leader);
        if (seen.length === 2) break;
      }
    })();
    const observedFirst = Date.now() + 5000;
    while (seen.length === 0 && Date.now() < observedFirst) await sleep(20);
    assert.deepEqual(seen, [{ candidate: 'node-1', token: first.token }]);
    await first.resign();
    const second = await pair.locks.election(key).campaign('node-2', { ttl: '30s' });
    await within(watching, 5000, 'the second term');
    assert.deepEqual(seen[1], { candidate: 'node-2', token: second.token });
    await second.resign();
  });

  test('election: return() ends a pending next()', async () => {
    const key = uniqueKey('observe-return');
    const iterator = pair.locks.election(key).observe();
    const pending = iterator.next(); // nobody leads: it waits
    await sleep(100);
    await iterator.return();
    assert.deepEqual(await within(pending, 2000, 'the end'), { done: true, value: undefined });
    assert.deepEqual(await iterator.next(), { done: true, value: undefined });
  });

  test('election: bad input throws or rejects with LEASEHOLD_INVALID_INPUT', async () => {
    assert.throws(() => pair.locks.election(''), { code: 'LEASEHOLD_INVALID_INPUT' });
    assert.throws(() => pair.locks.election(null), { code: 'LEASEHOLD_INVALID_INPUT' });
    const election = pair.locks.election(uniqueKey('elect-bad'));
    for (const call of [
      () => election.campaign(''),
      () => election.campaign(7),
      () => election.campaign('a\nb'),
      () => election.campaign('x'.repeat(10_000)),
      () => election.campaign('ok', { ttl: 'soon' }),
      () => election.campaign('ok', 'options'),
    ]) {
      await assert.rejects(call(), { code: 'LEASEHOLD_INVALID_INPUT', retryable: false }, String(call));
    }
    assert.equal(await election.leader(), null);
  });
});

// A permit has no admin break (forceRelease names mutexes), so its loss is
// the other real one: the store goes away and renewal fails until the ttl.
for (const store of serverStores()) {
  test(`on ${store.name}: a permit whose store goes down aborts its signal with LEASEHOLD_LOST`, async () => {
    const proxy = await relay(store.url);
    const locks = await Locks.open(proxy.url);
    try {
      const ttl = 900;
      const permit = await locks.semaphore(uniqueKey('sem-outage'), 2).tryAcquire({ ttl });
      const aborted = abortedWithin(permit.signal, 10_000);
      const cutAt = Date.now();
      proxy.cut();
      await aborted;
      // Lost at the latest when the ttl runs out unrenewed; slack for load.
      assert.ok(Date.now() - cutAt <= ttl + 2000, `aborted after ${Date.now() - cutAt} ms`);
      assert.equal(permit.signal.reason.code, 'LEASEHOLD_LOST');
      assert.equal(permit.isLost(), true);
      await permit.release().catch(() => {});
    } finally {
      await locks.close();
    }
  });
}

test('close() ends observers, pending campaigns and permit waits, and releases what is held', async () => {
  const { locks, other: watcher, key } = await sqlitePair('close-primitives');
  const permit = await locks.semaphore(`${key}:sem`, 1).tryAcquire({ ttl: '30s' });
  const multi = await locks.acquireMany([`${key}:a`, `${key}:b`], { ttl: '30s' });
  const blocker = await watcher.election(`${key}:elect`).campaign('other', { ttl: '30s' });
  const campaign = locks.election(`${key}:elect`).campaign('me', { wait: '30s' });
  const campaignEnds = assert.rejects(campaign, { code: 'LEASEHOLD_CANCELLED' });
  const iterator = locks.election(`${key}:none`).observe();
  const observing = iterator.next();
  await sleep(150);
  await locks.close();
  await within(campaignEnds, 2000, 'the campaign end');
  assert.deepEqual(await within(observing, 2000, 'the observer end'), { done: true, value: undefined });
  assert.deepEqual(await watcher.semaphore(`${key}:sem`, 1).holders(), []);
  assert.equal(await watcher.inspect(`${key}:a`), null);
  assert.equal(permit.isLost(), true);
  assert.equal(multi.isLost(), true);
  await blocker.resign();
  await watcher.close();
});
