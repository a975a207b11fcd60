'use strict';
// The installed-from-tarballs smoke test (scripts/smoke-tarballs.sh): a new
// application's first use of the package, with the addon from the platform
// package and no Rust toolchain on PATH.
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const express = require('express');
const { Locks } = require('leasehold');
const { lockRoute } = require('leasehold/express');

async function main() {
  // The addon came from the platform package, not from a build next to index.js.
  const main = path.dirname(require.resolve('leasehold'));
  assert.deepEqual(fs.readdirSync(main).filter((f) => f.endsWith('.node')), [], 'the main package ships no addon');
  const manifest = JSON.parse(fs.readFileSync(path.join(main, 'package.json'), 'utf8'));
  assert.deepEqual(manifest.optionalDependencies, { [`leasehold-${process.platform}-${process.arch}-gnu`]: manifest.version }, 'exact-version optionalDependencies');
  const platformPackage = path.dirname(require.resolve(`leasehold-${process.platform}-${process.arch}-gnu/package.json`));
  console.log(`addon: ${fs.readdirSync(platformPackage).filter((f) => f.endsWith('.node')).join(', ')} from ${path.basename(platformPackage)}`);

  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'leasehold-smoke-'));
  const locks = await Locks.open(`sqlite://${path.join(dir, 'locks.db')}`);
  const lease = await locks.acquire('orders:42', { ttl: '5s', wait: '1s' });
  assert.equal(typeof lease.token, 'bigint');
  assert.equal(await locks.tryAcquire('orders:42'), null, 'a held key is not granted twice');
  await lease.release();
  const again = await locks.tryAcquire('orders:42');
  assert.ok(again && again.token > lease.token, 'the next holder gets a larger token');
  await again.release();
  console.log(`Locks.open, acquire/release on sqlite: tokens ${lease.token} then ${again.token}`);

  const app = express();
  app.post('/orders/:id', lockRoute(locks, { key: (req) => `order:${req.params.id}`, wait: 0 }), (req, res) => {
    res.json({ key: req.lease.key, token: String(req.lease.token) });
  });
  const server = app.listen(0, '127.0.0.1');
  await new Promise((resolve) => server.once('listening', resolve));
  const held = await locks.acquire('order:7');
  const url = `http://127.0.0.1:${server.address().port}/orders/7`;
  const busy = await fetch(url, { method: 'POST' });
  assert.equal(busy.status, 409);
  await held.release();
  const ok = await fetch(url, { method: 'POST' });
  assert.equal(ok.status, 200);
  assert.equal((await ok.json()).key, 'order:7');
  console.log(`Express lockRoute: 409 while held, then 200`);
  await new Promise((resolve) => server.close(resolve));
  await locks.close();
  fs.rmSync(dir, { recursive: true, force: true });
  console.log('smoke app: all checks passed');
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
