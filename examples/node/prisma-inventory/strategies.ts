// The four ways the shop sells one item, in Prisma. Each reads the stock,
// "pays" (waits PAY_MS, as a payment call would), then writes stock - 1;
// they differ in what keeps two buyers of the last item apart.
import type { Locks } from 'leasehold';
import type { PrismaClient } from './generated/prisma/client.ts';

export type Outcome = 'sold' | 'sold_out' | 'rejected' | 'failed';
export interface Result {
  outcome: Outcome;
  retries: number;
}
export interface Context {
  prisma: PrismaClient;
  locks: Locks;
}

const PAY_MS = Number(process.env.PAY_MS ?? 5);
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
/** Payment takes between half and one and a half times PAY_MS. */
const pay = () => sleep(PAY_MS * (0.5 + Math.random()));

async function readStock(prisma: PrismaClient, id: string) {
  return prisma.product.findUniqueOrThrow({ where: { id }, select: { stock: true, version: true } });
}

/** No protection: two buyers read the same stock, one sale is lost or the last item sold twice. */
async function none({ prisma }: Context, id: string): Promise<Result> {
  const { stock } = await readStock(prisma, id);
  if (stock <= 0n) return { outcome: 'sold_out', retries: 0 };
  await pay();
  await prisma.product.update({ where: { id }, data: { stock: stock - 1n } });
  return { outcome: 'sold', retries: 0 };
}

/**
 * A leasehold lease per product across all PM2 workers, and a write fenced
 * by its token: `updateMany` matches only while no newer holder has written
 * (`fence <= token`), so a holder paused past its ttl cannot undo a newer sale.
 */
async function lease({ prisma, locks }: Context, id: string): Promise<Result> {
  try {
    return await locks.withLock(`shop:${id}`, { ttl: '10s', wait: '60s' }, async (held) => {
      const { stock } = await readStock(prisma, id);
      if (stock <= 0n) return { outcome: 'sold_out', retries: 0 };
      await pay();
      const { count } = await prisma.product.updateMany({
        where: { id, fence: { lte: held.token } },
        data: { stock: stock - 1n, fence: held.token },
      });
      return { outcome: count === 1 ? 'sold' : 'rejected', retries: 0 };
    });
  } catch (error) {
    if ((error as { code?: string }).code === 'LEASEHOLD_TIMEOUT') return { outcome: 'failed', retries: 0 };
    throw error;
  }
}

/** PostgreSQL's row lock in an interactive transaction: FOR UPDATE holds the row until it commits. */
async function rowLock({ prisma }: Context, id: string): Promise<Result> {
  return prisma.$transaction(
    async (tx) => {
      const rows = await tx.$queryRaw<{ stock: bigint }[]>`
        SELECT stock FROM prisma_inventory_products WHERE id = ${id} FOR UPDATE`;
      if (rows.length === 0) throw new Error(`no product ${id}`);
      const stock = BigInt(rows[0].stock);
      if (stock <= 0n) return { outcome: 'sold_out', retries: 0 } as Result;
      await pay();
      await tx.product.update({ where: { id }, data: { stock: stock - 1n } });
      return { outcome: 'sold', retries: 0 } as Result;
    },
    // Buyers of one product queue on its row: allow the queue's wait.
    { maxWait: 60_000, timeout: 60_000 },
  );
}

const MAX_ATTEMPTS = 100;

/**
 * Version compare-and-swap: the write matches only the version it read. On
 * a conflict, try again after a jittered delay that doubles from 1 ms up to
 * 50 ms, at most MAX_ATTEMPTS times in all; then the order fails.
 */
async function optimistic({ prisma }: Context, id: string): Promise<Result> {
  for (let attempt = 1; ; attempt++) {
    const { stock, version } = await readStock(prisma, id);
    if (stock <= 0n) return { outcome: 'sold_out', retries: attempt - 1 };
    await pay();
    const { count } = await prisma.product.updateMany({
      where: { id, version },
      data: { stock: stock - 1n, version: { increment: 1 } },
    });
    if (count === 1) return { outcome: 'sold', retries: attempt - 1 };
    if (attempt === MAX_ATTEMPTS) return { outcome: 'failed', retries: attempt - 1 };
    await sleep(Math.random() * Math.min(50, 2 ** (attempt - 1)));
  }
}

export const STRATEGIES: Record<string, (ctx: Context, id: string) => Promise<Result>> = {
  none,
  lease,
  'row-lock': rowLock,
  optimistic,
};
