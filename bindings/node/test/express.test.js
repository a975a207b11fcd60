'use strict';
// `leasehold/express` in a real Express app over HTTP, on every store: the
// 409 with Retry-After and a problem body, the bounded wait, 503 when the
// store goes down, req.lease, and the release on every path (response,
// handler error, client disconnect, disconnect while waiting).

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const { spawnSync } = require('node:child_process');
const path = require('node:path');
const { setTimeout: sleep } = require('node:timers/promises');
const express = require('express');
const { Locks } = require('leasehold');
const { lockRoute, problemTypes } = require('leasehold/express');
const { serverStores, uniqueKey, describeEachStore } = require('./stores');
const { relay } = require('./proxy');
const { serve, serveSuite, post, postThenDisconnect, eventually, gate } = require('./http');
const { destroyFilesInPlace } = require('./files');

function assertProblem(reply, { status, type, key }) {
  assert.equal(reply.status, status);
  assert.equal(reply.headers.get('content-type'), 'application/problem+json');
  assert.equal(reply.body.type, type);
  assert.equal(reply.body.status, status);
  assert.equal(typeof reply.body.title, 'string');
  assert.equal(typeof reply.body.detail, 'string');
  assert.equal(reply.body.key, key);
}

describeEachStore('lockRoute on', (store, pair) => {
  const seen = []; // what handlers and the error handler saw
  const gates = new Map(); // key -> gate a /slow handler waits on
  const server = serveSuite((app) => {
    const keyFromPath = (req) => req.params.key;
    app.post('/run/:key', lockRoute(pair.locks, { key: keyFromPath, ttl: '10s' }), async (req, res) => {
      seen.push({ key: req.params.key, token: req.lease.token });
      const held = await pair.other.inspect(req.params.key);
      res.json({ token: String(req.lease.token), heldDuringHandler: held?.token === req.lease.token });
    });
    const waited = (req, res) => {
      seen.push({ key: req.params.key, waited: true });
      res.json({ token: String(req.lease.token) });
    };
    app.post('/wait/:key', lockRoute(pair.locks, { key: keyFromPath, ttl: '10s', wait: '700ms' }), waited);
    app.post('/wait-long/:key', lockRoute(pair.locks, { key: keyFromPath, ttl: '10s', wait: '10s' }), waited);
    app.post('/slow/:key', lockRoute(pair.locks, { key: keyFromPath, ttl: '10s', wait: '20s' }), async (req, res) => {
      seen.push({ key: req.params.key, slow: true });
      await gates.get(req.params.key).opened;
      res.end('done');
    });
    app.post('/slow-key/:key', lockRoute(pair.locks, { key: async (req) => { await sleep(300); return req.params.key; } }), (req, res) => {
      seen.push({ key: req.params.key, slowKey: true });
      res.end('done');
    });
    app.post('/throw/:key', lockRoute(pair.locks, { key: keyFromPath }), (req) => {
      throw new Error(`handler failed under ${req.lease.token}`);
    });
    app.post('/reject/:key', lockRoute(pair.locks, { key: keyFromPath }), async (req) => {
      await sleep(10);
      throw new Error(`async handler failed under ${req.lease.token}`);
    });
    app.post('/bad-key-fn', lockRoute(pair.locks, { key: () => { throw new Error('no key for you'); } }), () => {
      seen.push({ badKeyFnHandlerRan: true });
    });
    app.post('/no-lock', lockRoute(pair.locks, { key: () => null }), (req, res) => {
      res.json({ lease: req.lease === undefined ? 'none' : 'some' });
    });
    app.post('/empty-key', lockRoute(pair.locks, { key: () => '' }), (req, res) => res.end());
  }, seen);

  test('a free key: the handler runs with req.lease, released before the client has the answer', async () => {
    const key = uniqueKey('free');
    const reply = await post(`${server.base}/run/${key}`);
    assert.equal(reply.status, 200);
    assert.equal(reply.body.heldDuringHandler, true, 'the lease is held at the store while the handler runs');
    assert.ok(BigInt(reply.body.token) > 0n);
    assert.equal(await pair.other.inspect(key), null, 'released as soon as the response arrived');
    const again = await post(`${server.base}/run/${key}`);
    assert.equal(again.status, 200, 'the next request gets the key at once');
    assert.ok(BigInt(again.body.token) > BigInt(reply.body.token), 'fencing tokens increase');
  });

  test('busy: 409, Retry-After in whole seconds rounded up, problem+json with key and retryAfterMs', async () => {
    const key = uniqueKey('busy');
    const held = await pair.other.tryAcquire(key, { ttl: '10s' });
    const before = seen.length;
    const reply = await post(`${server.base}/run/${key}`);
    assertProblem(reply, { status: 409, type: problemTypes.locked, key });
    const ms = reply.body.retryAfterMs;
    assert.ok(Number.isInteger(ms) && ms > 0 && ms <= 10_000, `retryAfterMs ${ms}`);
    assert.equal(reply.body.retry_after_ms, ms, "the Rust layer's field name too");
    assert.equal(reply.headers.get('retry-after'), String(Math.ceil(ms / 1000)));
    assert.equal(seen.length, before, 'the handler did not run');
    assert.equal((await pair.other.inspect(key)).token, held.token, 'the holder keeps its lease');
    await held.release();
  });

  test('wait > 0: waits up to the bound, then gets the key when the holder lets go', async () => {
    const key = uniqueKey('wait');
    const held = await pair.other.tryAcquire(key, { ttl: '10s' });
    const started = Date.now();
    const replying = post(`${server.base}/wait-long/${key}`);
    await sleep(200);
    await held.release();
    const reply = await replying;
    assert.equal(reply.status, 200);
    assert.ok(Date.now() - started >= 190, 'it waited for the holder');
    assert.ok(BigInt(reply.body.token) > held.token);
  });

  test('wait > 0: a key held past the bound is a 409 after the bound', async () => {
    const key = uniqueKey('wait-409');
    const held = await pair.other.tryAcquire(key, { ttl: '10s' });
    const started = Date.now();
    const reply = await post(`${server.base}/wait/${key}`);
    const elapsed = Date.now() - started;
    assertProblem(reply, { status: 409, type: problemTypes.locked, key });
    assert.ok(elapsed >= 650, `answered after ${elapsed} ms, before the 700 ms bound`);
    assert.ok(reply.body.retryAfterMs > 0 && reply.body.retryAfterMs <= 10_000);
    assert.equal(reply.headers.get('retry-after'), String(Math.ceil(reply.body.retryAfterMs / 1000)));
    await held.release();
  });

  test('a handler that throws: 500 from the error handler, and the lease is released', async () => {
    for (const route of ['throw', 'reject']) {
      const key = uniqueKey(route);
      const reply = await post(`${server.base}/${route}/${key}`);
      assert.equal(reply.status, 500);
      assert.match(reply.body.error, /handler failed under \d+/);
      assert.equal(await pair.other.inspect(key), null, `${route}: released`);
    }
  });

  test('a client that disconnects while the handler runs: the lease is released', async () => {
    const key = uniqueKey('disconnect');
    gates.set(key, gate());
    await postThenDisconnect(
      `${server.base}/slow/${key}`,
      eventually(async () => (await pair.other.inspect(key)) !== null, 5000, 'the handler holds the key'),
    );
    await eventually(async () => (await pair.other.inspect(key)) === null, 5000, 'released after the disconnect');
    gates.get(key).open(); // the handler ends on a closed connection
  });

  test('a client that disconnects while waiting stops waiting and never takes the key', async () => {
    const key = uniqueKey('disconnect-wait');
    gates.set(key, gate());
    const held = await pair.other.tryAcquire(key, { ttl: '10s' });
    const before = seen.filter((s) => s.key === key).length;
    await postThenDisconnect(`${server.base}/slow/${key}`, sleep(300));
    await sleep(200);
    await held.release();
    await sleep(500);
    assert.equal(await pair.other.inspect(key), null, 'the abandoned wait did not take the key');
    assert.equal(seen.filter((s) => s.key === key).length, before, 'the handler never ran');
    gates.get(key).open();
  });

  test('a client gone before an async key function settled: no lock is taken', async () => {
    const key = uniqueKey('gone-before-key');
    await postThenDisconnect(`${server.base}/slow-key/${key}`, sleep(50));
    await sleep(600);
    assert.equal(await pair.other.inspect(key), null, 'nothing holds the key');
    assert.equal(seen.filter((s) => s.key === key).length, 0, 'the handler never ran');
  });

  test('a key function that throws goes to next(error): 500, no lock, no handler', async () => {
    const before = seen.filter((s) => s.badKeyFnHandlerRan).length;
    const reply = await post(`${server.base}/bad-key-fn`);
    assert.equal(reply.status, 500);
    assert.equal(reply.body.error, 'no key for you');
    assert.equal(seen.filter((s) => s.badKeyFnHandlerRan).length, before);
  });

  test('a null key lets the request through without a lock; an invalid key is a 400', async () => {
    const through = await post(`${server.base}/no-lock`);
    assert.equal(through.status, 200);
    assert.equal(through.body.lease, 'none');
    const bad = await post(`${server.base}/empty-key`);
    assertProblem(bad, { status: 400, type: problemTypes.invalidKey, key: '' });
    assert.equal(bad.headers.get('retry-after'), null);
  });
});

// Store down: a Locks opened through a relay that is then cut, on every
// store reached over the network (memory and SQLite have no server to lose).
for (const store of serverStores()) {
  test(`lockRoute on ${store.name}: the store going down gives 503 problem+json`, async () => {
    const through = await relay(store.url);
    const locks = await Locks.open(through.url);
    const app = express();
    app.post('/run/:key', lockRoute(locks, { key: (req) => req.params.key, wait: '1s' }), (req, res) => res.end('ran'));
    const server = await serve(app);
    try {
      const key = uniqueKey('down');
      assert.equal((await post(`${server.base}/run/${key}`)).status, 200, 'served while the store is up');
      through.cut();
      const reply = await post(`${server.base}/run/${key}`);
      assertProblem(reply, { status: 503, type: problemTypes.storeUnavailable, key });
      assert.equal(reply.headers.get('retry-after'), '1');
      assert.equal(reply.body.retryAfterMs, 1000);
    } finally {
      await server.close();
      await locks.close();
    }
  });
}

// SQLite has no server to lose; a database file overwritten under the open
// store is a store failing for good: 503 without Retry-After.
test('lockRoute on sqlite: a destroyed database file gives 503 problem+json, not retryable', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'leasehold-node-down-'));
  const locks = await Locks.open(`sqlite://${path.join(dir, 'locks.db')}`);
  const app = express();
  app.post('/run/:key', lockRoute(locks, { key: (req) => req.params.key }), (req, res) => res.end('ran'));
  const server = await serve(app);
  try {
    const key = uniqueKey('sqlite-down');
    assert.equal((await post(`${server.base}/run/${key}`)).status, 200, 'served while the store is whole');
    destroyFilesInPlace(dir);
    const reply = await post(`${server.base}/run/${key}`);
    assertProblem(reply, { status: 503, type: problemTypes.storeUnavailable, key });
    assert.equal(reply.headers.get('retry-after'), null);
    assert.equal(reply.body.retryAfterMs, undefined);
  } finally {
    await server.close();
    await locks.close();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('lockRoute rejects bad options when it is called, before any request', async () => {
  const locks = await Locks.open('memory://');
  const key = () => 'k';
  const bad = [
    [{}, { key }],
    [locks, undefined],
    [locks, {}],
    [locks, { key: 'users' }],
    [locks, { key, ttl: '1ms' }],
    [locks, { key, ttl: 'soon' }],
    [locks, { key, ttl: '25h' }],
    [locks, { key, wait: -1 }],
    [locks, { key, wait: Infinity }],
    [locks, { key, wait: '25h' }],
    [locks, { key, timeout: '1s' }],
  ];
  for (const [handle, options] of bad) {
    assert.throws(() => lockRoute(handle, options), { code: 'LEASEHOLD_INVALID_INPUT', retryable: false }, JSON.stringify(options));
  }
  assert.equal(typeof lockRoute(locks, { key, ttl: 100, wait: '24h' }), 'function');
  await locks.close();
});

test('leasehold/express loads with require and import, and does not load express', () => {
  const script = `
    const { lockRoute } = require('leasehold/express');
    const loaded = Object.keys(require.cache).some((file) => file.includes('/node_modules/express/'));
    import('leasehold/express').then((esm) => console.log(typeof lockRoute, esm.lockRoute === lockRoute, loaded));`;
  const child = spawnSync(process.execPath, ['-e', script], { cwd: path.resolve(__dirname, '..'), encoding: 'utf8', timeout: 20_000 });
  assert.equal(child.stderr, '');
  assert.equal(child.stdout.trim(), 'function true false');
});
