// Type-checked (never run) usage of `leasehold/express` with Express's own
// types: the middleware fits a route, and `req.lease` is typed in handlers.
import express, { type Request } from 'express';
import type { IncomingMessage } from 'node:http';
import { Locks, type Lease } from 'leasehold';
import { limitConcurrency, lockRoute, problemTypes, type LockRouteProblem } from 'leasehold/express';

export async function expressUsage(): Promise<void> {
  const locks = await Locks.open('memory://');
  const app = express();
  app.post('/users', lockRoute(locks, { key: () => 'users', ttl: '30s', wait: 0 }), (req, res) => {
    const lease: Lease | undefined = req.lease;
    res.json({ token: String(lease?.token) });
  });
  // Untyped parameters see framework fields; annotated ones get their types.
  app.post('/jobs/:id', lockRoute(locks, {
    key: (req) => `job:${req.params.id}`,
    retryAfter: ({ holderRemainingMs }) => Math.min(holderRemainingMs, 2000),
    onError: (error, req) => console.error(error.code, req.url),
  }), (_req, res) => {
    res.end();
  });
  app.get('/slow', limitConcurrency(locks, { key: 'slow', permits: 2, retryAfter: '1s' }), (_req, res) => res.end());
  app.post('/orders/:id', lockRoute(locks, { key: (req) => `order:${req.params.id}`, wait: '2s' }), (_req, res) => {
    res.end();
  });
  app.put('/accounts/:id', lockRoute(locks, { key: (req: Request) => `account:${req.params.id}` }), (_req, res) => {
    res.end();
  });
  // Plain Node requests, and async keys that skip the lock.
  const plain = lockRoute(locks, { key: async (req: IncomingMessage) => (req.method === 'GET' ? null : req.url) });
  void plain;
  // At most 4 reports at once across every process; 429 when full.
  app.get('/report', limitConcurrency(locks, { key: 'reports', permits: 4, wait: '2s', status: 429 }), (req, res) => {
    const permit: Lease | undefined = req.permit;
    res.json({ slot: permit?.slot });
  });
  app.get('/tenant/:id', limitConcurrency(locks, { key: (req: Request) => `tenant:${req.params.id}`, permits: 2 }), (_req, res) => {
    res.end();
  });
  const limited: string = problemTypes.concurrencyLimit;
  console.log(limited);
  const locked: string = problemTypes.locked;
  const body = { status: 409 } as LockRouteProblem;
  console.log(locked, body.retryAfterMs);
}
