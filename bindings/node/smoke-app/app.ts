// Type-checked under "moduleResolution": "node16" and "bundler"
// (tsconfig.node16.json, tsconfig.bundler.json): the package's types as an
// application sees them once installed.
import express from 'express';
import { Locks, type Lease } from 'leasehold';
import { lockRoute } from 'leasehold/express';

export async function typed(): Promise<bigint> {
  const locks: Locks = await Locks.open('memory://');
  const lease: Lease | null = await locks.tryAcquire('k', { ttl: '5s' });
  const app = express();
  app.post('/x', lockRoute(locks, { key: () => 'x', wait: 0 }), (req, res) => {
    res.json({ token: String(req.lease?.token) });
  });
  const token = lease ? lease.token : 0n;
  await lease?.release();
  await locks.close();
  return token;
}
