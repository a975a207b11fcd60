// The same package from a plain ES module: named and default imports.
import leasehold, { Locks } from 'leasehold';
import { lockRoute } from 'leasehold/express';
import assert from 'node:assert/strict';

assert.equal(leasehold.Locks, Locks);
assert.equal(typeof lockRoute, 'function');
const locks = await Locks.open('memory://');
const lease = await locks.tryAcquire('esm');
assert.equal(typeof lease?.token, 'bigint');
await lease.release();
await locks.close();
console.log('app.mjs: ESM import works');
