'use strict';
// `limitConcurrency` in a real Express app over HTTP, on every store: at most
// `permits` requests run at once (across two Locks handles, as two
// processes), 503 or 429 with Retry-After and a problem body when full, the
// bounded wait, 503 when the store goes down, and the permit released on
// every path (response, handler error, client disconnect).

const test = require('node:test');
const assert = require('node:assert/strict');
const { setTimeout: sleep } = require('node:timers/promises');
const express = require('express');
const { Locks } = require('leasehold');
const { limitConcurrency, problemTypes } = require('leasehold/express');
const { serverStores, uniqueKey, describeEachStore } = require('./stores');
const { relay } = require('./proxy');
const { serve, serveSuite, post, postThenDisconnect, eventually, gate } = require('./http');

describeEachStore('limitConcurrency on', (store, pair) => {
  const gates = new Map(); // key -> gate the /slow handler waits on
  const inHandler = new Map(); // key -> requests in the handler now
  const seen = []; // what handlers and the error handler saw
  const server = serveSuite((app) => {
    const keyFromPath = (req) => req.params.key;
    const slow = async (req, res) => {
      const { key } = req.params;
      inHandler.set(key, (inHandler.get(key) ?? 0) + 1);
      seen.push({ key, slot: req.permit.slot });
      await gates.get(key).opened;
      inHandler.set(key, inHandler.get(key) - 1);
      res.json({ slot: req.permit.slot });
    };
    app.post('/slow/:key', limitConcurrency(pair.locks, { key: keyFromPath, permits: 2, ttl: '10s' }), slow);
    app.post('/slow-429/:key', limitConcurrency(pair.locks, { key: keyFromPath, permits: 1, ttl: '10s', status: 429 }), slow);
    app.post('/wait/:key', limitConcurrency(pair.locks, { key: keyFromPath, permits: 1, ttl: '10s', wait: '10s' }), slow);
    app.post('/throw/:key', limitConcurrency(pair.locks, { key: keyFromPath, permits: 1 }), (req) => {
      throw new Error(`handler failed in slot ${req.permit.slot}`);
    });
    app.post('/fixed', limitConcurrency(pair.locks, { key: 'limit-test-fixed', permits: 3 }), (req, res) => {
      res.json({ slot: req.permit.slot });
    });
    app.post('/bad-key', limitConcurrency(pair.locks, { key: () => '', permits: 1 }), (req, res) => res.end());
    app.post('/no-limit', limitConcurrency(pair.locks, { key: () => null, permits: 1 }), (req, res) => {
      res.json({ permit: req.permit === undefined ? 'none' : 'some' });
    });
  }, seen);

  const holders = (key, permits) => pair.other.semaphore(key, permits).holders();

  test('permits run at once, the next request gets 503 with Retry-After and a problem body', async () => {
    const key = uniqueKey('limit');
    gates.set(key, gate());
    const running = [post(`${server.base}/slow/${key}`), post(`${server.base}/slow/${key}`)];
    await eventually(() => inHandler.get(key) === 2, 5000, 'two requests in the handler');
    const full = await post(`${server.base}/slow/${key}`);
    assert.equal(full.status, 503);
    assert.equal(full.headers.get('content-type'), 'application/problem+json');
    assert.equal(full.body.type, problemTypes.concurrencyLimit);
    assert.equal(full.body.status, 503);
    assert.equal(full.body.key, key);
    const retryAfter = Number(full.headers.get('retry-after'));
    assert.ok(Number.isInteger(retryAfter) && retryAfter >= 1 && retryAfter <= 10, `Retry-After ${retryAfter}`);
    assert.equal(retryAfter, Math.ceil(full.body.retryAfterMs / 1000));
    // The Rust layer's document (the addon renders it): its title, and
    // its name for the wait beside this package's.
    assert.equal(full.body.title, 'Concurrency limit reached');
    assert.equal(full.body.retry_after_ms, full.body.retryAfterMs);
    // Another process on the same store counts against the same permits.
    assert.equal((await holders(key, 2)).length, 2);
    gates.get(key).open();
    const replies = await Promise.all(running);
    assert.deepEqual(replies.map((r) => r.body.slot).sort(), [0, 1]);
    assert.deepEqual(await holders(key, 2), [], 'released when the responses finished');
    assert.equal((await post(`${server.base}/fixed`)).status, 200);
  });

  test('status: 429 answers 429 with Retry-After', async () => {
    const key = uniqueKey('limit-429');
    gates.set(key, gate());
    const running = post(`${server.base}/slow-429/${key}`);
    await eventually(() => inHandler.get(key) === 1, 5000, 'the first request in the handler');
    const full = await post(`${server.base}/slow-429/${key}`);
    assert.equal(full.status, 429);
    assert.equal(full.body.status, 429);
    assert.equal(full.body.type, problemTypes.concurrencyLimit);
    assert.ok(Number(full.headers.get('retry-after')) >= 1);
    gates.get(key).open();
    assert.equal((await running).status, 200);
  });

  test('a permit held elsewhere is waited for up to `wait`', async () => {
    const key = uniqueKey('limit-wait');
    gates.set(key, gate());
    gates.get(key).open();
    const elsewhere = await pair.other.semaphore(key, 1).tryAcquire({ ttl: '30s' });
    const waiting = post(`${server.base}/wait/${key}`);
    await sleep(200);
    assert.equal(inHandler.get(key) ?? 0, 0, 'not in the handler while the permit is held elsewhere');
    await elsewhere.release();
    const reply = await waiting;
    assert.equal(reply.status, 200);
    assert.deepEqual(await holders(key, 1), []);
  });

  test('a handler error releases the permit', async () => {
    const key = uniqueKey('limit-throw');
    const reply = await post(`${server.base}/throw/${key}`);
    assert.equal(reply.status, 500);
    assert.match(reply.body.error, /handler failed in slot 0/);
    await eventually(async () => (await holders(key, 1)).length === 0, 5000, 'the release after the error');
  });

  test('a client that disconnects releases its permit', async () => {
    const key = uniqueKey('limit-disconnect');
    gates.set(key, gate()); // never opened: only the disconnect ends it
    await postThenDisconnect(`${server.base}/slow/${key}`, eventually(() => inHandler.get(key) === 1, 5000, 'in the handler'));
    await eventually(async () => (await holders(key, 2)).length === 0, 5000, 'the release after the disconnect');
    gates.get(key).open();
  });

  test('a derived key that is not valid gives 400; null skips the limit', async () => {
    const bad = await post(`${server.base}/bad-key`);
    assert.equal(bad.status, 400);
    assert.equal(bad.body.type, problemTypes.invalidKey);
    const none = await post(`${server.base}/no-limit`);
    assert.deepEqual(none.body, { permit: 'none' });
  });
});

for (const store of serverStores()) {
  test(`limitConcurrency on ${store.name}: the store going down gives 503 problem+json`, async () => {
    const proxy = await relay(store.url);
    const locks = await Locks.open(proxy.url);
    const app = express();
    let ran = false;
    app.post('/x', limitConcurrency(locks, { key: 'limit-down', permits: 2, status: 429 }), (req, res) => {
      ran = true;
      res.end();
    });
    const server = await serve(app);
    try {
      proxy.cut();
      const reply = await post(`${server.base}/x`);
      assert.equal(reply.status, 503, JSON.stringify(reply.body));
      assert.equal(reply.body.type, problemTypes.storeUnavailable);
      assert.equal(ran, false);
    } finally {
      await server.close();
      await locks.close();
    }
  });
}

test('limitConcurrency rejects bad options when it is called, before any request', async () => {
  const locks = await Locks.open('memory://');
  try {
    for (const options of [
      undefined,
      {},
      { key: 'k' },
      { key: 'k', permits: 0 },
      { key: 'k', permits: 1.5 },
      { key: 'k', permits: 2000 },
      { key: '', permits: 1 },
      { key: 7, permits: 1 },
      { key: 'k', permits: 1, status: 409 },
      { key: 'k', permits: 1, ttl: 'soon' },
      { key: 'k', permits: 1, wait: '2d' },
      { key: 'k', permits: 1, wait: Infinity },
      { key: 'k', permits: 1, extra: true },
    ]) {
      assert.throws(() => limitConcurrency(locks, options), { code: 'LEASEHOLD_INVALID_INPUT' }, JSON.stringify(options));
    }
    assert.throws(() => limitConcurrency({}, { key: 'k', permits: 1 }), { code: 'LEASEHOLD_INVALID_INPUT' });
    assert.deepEqual(await locks.list(''), []);
  } finally {
    await locks.close();
  }
});
