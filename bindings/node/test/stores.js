'use strict';
// The stores a test run covers: memory and SQLite always; PostgreSQL, Redis
// and MongoDB when scripts/test-services.sh exported their URLs. With
// LEASEHOLD_REQUIRE_SERVERS=1 a missing server fails the run.

const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const test = require('node:test');
const { Locks } = require('leasehold');

// [name, variable, expiry granularity in ms]: how coarse the store's own
// expiry is. etcd's leases have whole-second TTLs, so it rounds a ttl up to
// whole seconds (at least its minimum) and reports that time left; every
// other store ends a lease at its ttl to the millisecond (0).
const SERVERS = [
  ['postgres', 'LEASEHOLD_TEST_POSTGRES', 0],
  ['redis', 'LEASEHOLD_TEST_REDIS', 0],
  ['mongodb', 'LEASEHOLD_TEST_MONGODB', 0],
  ['etcd', 'LEASEHOLD_TEST_ETCD', 1000],
];

function stores() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'leasehold-node-'));
  process.on('exit', () => fs.rmSync(dir, { recursive: true, force: true }));
  const list = [
    // memory:// is one store per open: "shared" tells tests to use one handle.
    { name: 'memory', url: 'memory://', shared: true, expiryGranularityMs: 0 },
    { name: 'sqlite', url: `sqlite://${path.join(dir, 'locks.db')}`, shared: false, expiryGranularityMs: 0 },
  ];
  const missing = [];
  for (const [name, env, expiryGranularityMs] of SERVERS) {
    const url = process.env[env];
    if (url) list.push({ name, url, shared: false, expiryGranularityMs });
    else missing.push(env);
  }
  if (process.env.LEASEHOLD_REQUIRE_SERVERS === '1' && missing.length > 0) {
    throw new Error(`LEASEHOLD_REQUIRE_SERVERS=1 but ${missing.join(', ')} not set`);
  }
  return list;
}

/** The stores behind a server, which a relay (proxy.js) can cut: all but memory and SQLite. */
function serverStores() {
  return stores().filter((s) => s.name !== 'memory' && s.name !== 'sqlite');
}

/**
 * The ttl `store` enforces for a requested `ttlMs`: rounded up to the
 * store's expiry granularity (and at least one step of it), never down.
 */
function enforcedTtlMs(store, ttlMs) {
  const g = store.expiryGranularityMs;
  return g > 0 ? Math.max(Math.ceil(ttlMs / g), 1) * g : ttlMs;
}

/** A key no other test (or earlier run) uses. */
function uniqueKey(prefix) {
  return `node-test:${prefix}:${process.pid}:${Date.now()}:${Math.random().toString(36).slice(2)}`;
}

/**
 * Two handles on `store`: `other` stands for another process on the same
 * store (memory:// is one store per open, so there it is `locks` itself).
 */
async function openPair(store) {
  const locks = await Locks.open(store.url);
  const other = store.shared ? locks : await Locks.open(store.url);
  return { locks, other };
}

/**
 * Two handles on the SQLite store (a second handle sees the same store,
 * as another process would) and a key of `prefix` no other test uses.
 */
async function sqlitePair(prefix) {
  const { locks, other } = await openPair(stores()[1]);
  return { locks, other, key: uniqueKey(prefix) };
}

/** Closes the handles of `openPair`. */
async function closePair({ locks, other }) {
  await locks.close();
  if (other !== locks) await other.close();
}

/**
 * A suite per store, titled `${title} ${store.name}`: `body(store, pair)`
 * declares its tests, which use `pair.locks` and `pair.other` (see
 * openPair). The handles open before the body's own `before` hooks run
 * and close after its `after` hooks.
 */
function describeEachStore(title, body) {
  for (const store of stores()) {
    test.describe(`${title} ${store.name}`, () => {
      const pair = {};
      test.before(async () => {
        Object.assign(pair, await openPair(store));
      });
      body(store, pair);
      test.after(() => closePair(pair));
    });
  }
}

module.exports = { stores, serverStores, uniqueKey, describeEachStore, enforcedTtlMs, sqlitePair };
