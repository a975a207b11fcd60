// The shop, one PM2 cluster worker (PM2 starts several; see
// ecosystem.config.js). POST /buy {"strategy", "product"} sells one item;
// GET /health says which worker answered.
//   DATABASE_URL  postgres://… for the products (required)
//   LOCKS_URL     leasehold store for the lease strategy (default: DATABASE_URL)
//   PORT          shared by the cluster (default 3000)
import http from 'node:http';
import { PrismaPg } from '@prisma/adapter-pg';
import { Locks } from 'leasehold';
import { PrismaClient } from './generated/prisma/client.ts';
import { STRATEGIES } from './strategies.ts';

async function readJson(req: http.IncomingMessage): Promise<{ strategy?: string; product?: unknown }> {
  let body = '';
  for await (const chunk of req) body += chunk;
  return JSON.parse(body || '{}');
}

function reply(res: http.ServerResponse, status: number, body: object) {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(body));
}

async function main() {
  const url = process.env.DATABASE_URL;
  if (!url) throw new Error('DATABASE_URL is not set');
  // Prisma 7 with a driver adapter: queries go through `pg`, no Rust engine.
  const prisma = new PrismaClient({ adapter: new PrismaPg({ connectionString: url, max: 8 }) });
  // One Locks per process: each PM2 worker has its own native runtime.
  const locks = await Locks.open(process.env.LOCKS_URL || url);
  const ctx = { prisma, locks };

  const server = http.createServer(async (req, res) => {
    try {
      if (req.method === 'GET' && req.url === '/health') return reply(res, 200, { pid: process.pid });
      if (req.method !== 'POST' || req.url !== '/buy') return reply(res, 404, { error: 'not found' });
      const { strategy, product } = await readJson(req);
      const buy = strategy === undefined ? undefined : STRATEGIES[strategy];
      if (!buy || typeof product !== 'string') {
        return reply(res, 400, { error: `strategy: one of ${Object.keys(STRATEGIES).join(', ')}; product: a string` });
      }
      const { outcome, retries } = await buy(ctx, product);
      return reply(res, 200, { outcome, retries, pid: process.pid });
    } catch (error) {
      return reply(res, 500, { error: String((error as Error).message ?? error), pid: process.pid });
    }
  });
  server.listen(Number(process.env.PORT ?? 3000), '127.0.0.1');

  // PM2 stops a worker with SIGINT: finish, release leases, disconnect.
  process.once('SIGINT', () => {
    server.close();
    Promise.all([locks.close(), prisma.$disconnect()]).finally(() => process.exit(0));
  });
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
