'use strict';
// The stores a test run covers: memory and SQLite always; PostgreSQL, Redis
// and MongoDB when scripts/test-services.sh exported their URLs. With
// LEASEHOLD_REQUIRE_SERVERS=1 a missing server fails the run.

const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { Locks } = require('leasehold');

const SERVERS = [
  ['postgres', 'LEASEHOLD_TEST_POSTGRES'],
  ['redis', 'LEASEHOLD_TEST_REDIS'],
  ['mongodb', 'LEASEHOLD_TEST_MONGODB'],
  ['etcd', 'LEASEHOLD_TEST_ETCD'],
];

function stores() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'leasehold-node-'));
  process.on('exit', () => fs.rmSync(dir, { recursive: true, force: true }));
  const list = [
    // memory:// is one store per open: "shared" tells tests to use one handle.
    { name: 'memory', url: 'memory://', shared: true },
    { name: 'sqlite', url: `sqlite://${path.join(dir, 'locks.db')}`, shared: false },
  ];
  const missing = [];
  for (const [name, env] of SERVERS) {
    const url = process.env[env];
    if (url) list.push({ name, url, shared: false });
    else missing.push(env);
  }
  if (process.env.LEASEHOLD_REQUIRE_SERVERS === '1' && missing.length > 0) {
    throw new Error(`LEASEHOLD_REQUIRE_SERVERS=1 but ${missing.join(', ')} not set`);
  }
  return list;
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

/** Closes the handles of `openPair`. */
async function closePair({ locks, other }) {
  await locks.close();
  if (other !== locks) await other.close();
}

module.exports = { stores, uniqueKey, openPair, closePair };
