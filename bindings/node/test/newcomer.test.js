'use strict';
// What a Node newcomer hit (issue 28, section 4): misspelt options were
// silently ignored, `withLock(key, fn)` needed an options argument, errors
// had no runtime class, and the Express middleware's Retry-After was the
// holder's whole remaining ttl with store failures never reported.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const express = require('express');
const { Locks, LeaseholdError, isLeaseholdError } = require('leasehold');
const { lockRoute, limitConcurrency } = require('leasehold/express');
const { serve, post } = require('./http');
const { destroyFilesInPlace } = require('./files');

async function withLocks(fn) {
  const locks = await Locks.open('memory://');
  try {
    return await fn(locks);
  } finally {
    await locks.close();
  }
}

async function rejectsInvalid(promise, pattern) {
  await assert.rejects(promise, (error) => {
    assert.equal(error.code, 'LEASEHOLD_INVALID_INPUT');
    assert.match(error.message, pattern);
    return true;
  });
}

test('unknown options are rejected by every acquire, before any I/O', () =>
  withLocks(async (locks) => {
    await rejectsInvalid(locks.tryAcquire('k', { tll: '5s' }), /^invalid options: unknown option "tll" for tryAcquire \(expected ttl, maxHold, signal\)$/);
    await rejectsInvalid(locks.acquire('k', { wiat: '1s' }), /unknown option "wiat" for acquire \(expected ttl, wait, maxHold, signal, fair\)/);
    // A try never waits: `wait` there is a mistake, not a no-op.
    await rejectsInvalid(locks.tryAcquire('k', { wait: '1s' }), /unknown option "wait" for tryAcquire/);
    await rejectsInvalid(locks.withLock('k', { tll: 1000 }, () => {}), /unknown option "tll" for acquire/);
    await rejectsInvalid(locks.acquireMany(['a', 'b'], { tll: 1 }), /for acquireMany/);
    await rejectsInvalid(locks.tryAcquireMany(['a', 'b'], { tll: 1 }), /for tryAcquireMany/);
    await rejectsInvalid(locks.semaphore('s', 2).tryAcquire({ tll: 1 }), /for tryAcquire/);
    await rejectsInvalid(locks.semaphore('s', 2).acquire({ tll: 1 }), /for acquire/);
    await rejectsInvalid(locks.rwLock('r').tryRead({ tll: 1 }), /for tryRead/);
    await rejectsInvalid(locks.rwLock('r').write({ tll: 1 }), /for write/);
    await rejectsInvalid(locks.election('e').campaign('me', { tll: 1 }), /for campaign/);
    assert.equal(await locks.inspect('k'), null, 'nothing was acquired');
  }));

test('withLock, withLocks, withPermit, withRead and withWrite take (key, fn) without options', () =>
  withLocks(async (locks) => {
    assert.equal(await locks.withLock('k', (lease) => typeof lease.token), 'bigint');
    assert.deepEqual(await locks.withLocks(['a', 'b'], (multi) => multi.keys), ['a', 'b']);
    assert.equal(await locks.semaphore('s', 2).withPermit((permit) => permit.slot), 0);
    assert.equal(await locks.rwLock('r').withRead(() => 'read'), 'read');
    assert.equal(await locks.rwLock('r').withWrite(() => 'written'), 'written');
    await rejectsInvalid(locks.withLock('k'), /invalid fn/);
  }));

test('errors are LeaseholdError instances, and isLeaseholdError narrows them', () =>
  withLocks(async (locks) => {
    const held = await locks.acquire('k');
    const busy = await locks.acquire('k', { wait: 0 }).catch((e) => e);
    assert.ok(busy instanceof LeaseholdError);
    assert.ok(busy instanceof Error);
    assert.equal(busy.name, 'LeaseholdError');
    assert.equal(busy.code, 'LEASEHOLD_BUSY');
    assert.ok(isLeaseholdError(busy));
    const invalid = await locks.acquire('').catch((e) => e);
    assert.ok(invalid instanceof LeaseholdError && invalid.code === 'LEASEHOLD_INVALID_INPUT');
    assert.equal(isLeaseholdError(new Error('other')), false);
    assert.equal(isLeaseholdError({ code: 'LEASEHOLD_BUSY', retryable: true }), false, 'not an Error');
    assert.equal(isLeaseholdError(undefined), false);
    await held.release();
  }));

test('ES module entry exports LeaseholdError and isLeaseholdError', async () => {
  const esm = await import('leasehold');
  assert.equal(typeof esm.isLeaseholdError, 'function');
  assert.equal(esm.LeaseholdError, LeaseholdError);
  assert.equal(esm.isLeaseholdError, isLeaseholdError);
});

test('lockRoute retryAfter replaces the holder remaining ttl as the 409 hint', () =>
  withLocks(async (locks) => {
    const app = express();
    const handler = (req, res) => res.end('ran');
    app.post('/default/:k', lockRoute(locks, { key: (req) => req.params.k }), handler);
    app.post('/fixed/:k', lockRoute(locks, { key: (req) => req.params.k, retryAfter: '1s' }), handler);
    const seen = [];
    const byFn = ({ key, holderRemainingMs }) => {
      seen.push([key, holderRemainingMs > 5000]);
      return 2500;
    };
    app.post('/fn/:k', lockRoute(locks, { key: (req) => req.params.k, retryAfter: byFn }), handler);
    app.post('/limit', limitConcurrency(locks, { key: 'lim', permits: 1, retryAfter: 300 }), handler);
    const server = await serve(app);
    try {
      const held = await locks.acquire('busy', { ttl: '10s' });
      const permit = await locks.semaphore('lim', 1).acquire({ ttl: '10s' });
      const fallback = await post(`${server.base}/default/busy`);
      assert.equal(fallback.status, 409);
      assert.ok(fallback.body.retryAfterMs > 5000, 'without the option: the holder remaining ttl');
      const fixed = await post(`${server.base}/fixed/busy`);
      assert.equal(fixed.status, 409);
      assert.equal(fixed.headers.get('retry-after'), '1');
      assert.equal(fixed.body.retryAfterMs, 1000);
      const fn = await post(`${server.base}/fn/busy`);
      assert.equal(fn.headers.get('retry-after'), '3');
      assert.equal(fn.body.retryAfterMs, 2500);
      assert.deepEqual(seen, [['busy', true]]);
      const limited = await post(`${server.base}/limit`);
      assert.equal(limited.status, 503);
      assert.equal(limited.body.retryAfterMs, 300);
      await held.release();
      await permit.release();
    } finally {
      await server.close();
    }
  }));

test('lockRoute onError hears the store failure it answers with 503, and not a 409', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'leasehold-node-onerror-'));
  const locks = await Locks.open(`sqlite://${path.join(dir, 'locks.db')}`);
  const heard = [];
  const app = express();
  const onError = (error, req) => heard.push([error.code, req.params.k]);
  app.post('/run/:k', lockRoute(locks, { key: (req) => req.params.k, onError }), (req, res) => res.end('ran'));
  const server = await serve(app);
  try {
    const held = await locks.acquire('busy');
    assert.equal((await post(`${server.base}/run/busy`)).status, 409);
    await held.release();
    assert.deepEqual(heard, [], 'a busy key is not an error');
    destroyFilesInPlace(dir);
    assert.equal((await post(`${server.base}/run/down`)).status, 503);
    assert.deepEqual(heard, [['LEASEHOLD_UNAVAILABLE', 'down']]);
  } finally {
    await server.close();
    await locks.close();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('lockRoute rejects a bad retryAfter or onError when declared', () =>
  withLocks(async (locks) => {
    assert.throws(() => lockRoute(locks, { key: () => 'k', retryAfter: 'soon' }), /invalid retryAfter/);
    assert.throws(() => lockRoute(locks, { key: () => 'k', onError: 'log' }), /invalid onError: expected a function/);
    assert.throws(() => limitConcurrency(locks, { key: 'k', permits: 1, retryAftr: 1 }), /invalid option "retryAftr"/);
  }));

test('an unreachable MongoDB is one sentence naming the timeout option and each server tried, not a Rust dump', async () => {
  // Port 1: nothing listens, so the driver's server selection times out.
  const error = await (async () => {
    const locks = await Locks.open('mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=300');
    try {
      return await locks.tryAcquire('k').catch((e) => e);
    } finally {
      await locks.close();
    }
  })().catch((e) => e);
  assert.equal(error.code, 'LEASEHOLD_UNAVAILABLE');
  assert.match(
    error.message,
    /^store unavailable \(mongodb\): no MongoDB server answered within the server selection timeout \(serverSelectionTimeoutMS in the URL, default 3000 ms\); tried 127\.0\.0\.1:1 \(I\/O error: Connection refused/,
  );
  assert.doesNotMatch(error.message, /Topology|labels|source: None|Kind:/);
});

test('a wait behind a lease of this same process says so in Node words', () =>
  withLocks(async (locks) => {
    const held = await locks.acquire('k');
    const error = await locks.acquire('k', { wait: 50 }).catch((e) => e);
    assert.equal(error.code, 'LEASEHOLD_TIMEOUT');
    assert.match(error.message, /\(a lease of this same process holds it: release it, or let its withLock callback finish\)$/);
    assert.doesNotMatch(error.message, /guard/);
    await held.release();
  }));

test('mongodb+srv:// URLs (MongoDB Atlas) are resolved, not refused for a missing resolver', async () => {
  // .invalid never resolves (RFC 6761): the lookup runs and finds no SRV record.
  const error = await Locks.open('mongodb+srv://app:secret@cluster0.example.invalid/shop').catch((e) => e);
  assert.ok(isLeaseholdError(error));
  assert.doesNotMatch(error.message, /dns-resolver|feature/);
  assert.match(error.message, /the DNS has no SRV record _mongodb\._tcp\.cluster0\.example\.invalid \(a mongodb\+srv:\/\/ URL needs one: check the host name\)$/);
  assert.doesNotMatch(error.message, /secret/);
});
