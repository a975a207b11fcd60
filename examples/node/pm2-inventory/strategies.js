'use strict';
// The four ways the shop sells one item. Each reads the stock, "pays" (waits
// PAY_MS, as a payment call would), then writes stock - 1; they differ in
// what keeps two buyers of the last item apart. Each returns
// { outcome: 'sold' | 'sold_out' | 'rejected' | 'failed', retries }.

const { TABLE } = require('./schema');

const PAY_MS = Number(process.env.PAY_MS ?? 5);

/** Payment takes between half and one and a half times PAY_MS. */
const pay = () => new Promise((resolve) => setTimeout(resolve, PAY_MS * (0.5 + Math.random())));

async function readStock(db, product, lock = '') {
  const { rows } = await db.query(`SELECT stock, version FROM ${TABLE} WHERE id = $1 ${lock}`, [product]);
  if (rows.length === 0) throw new Error(`no product ${product}`);
  return { stock: Number(rows[0].stock), version: rows[0].version };
}

/** No protection: two buyers read the same stock, one sale is lost or the last item sold twice. */
async function none({ pool }, product) {
  const { stock } = await readStock(pool, product);
  if (stock <= 0) return { outcome: 'sold_out', retries: 0 };
  await pay();
  await pool.query(`UPDATE ${TABLE} SET stock = $2 WHERE id = $1`, [product, stock - 1]);
  return { outcome: 'sold', retries: 0 };
}

/** A leasehold lock per product across all PM2 workers, and a write fenced by its token. */
async function lease({ pool, locks }, product) {
  try {
    return await locks.withLock(`shop:${product}`, { ttl: '10s', wait: '60s' }, async (held) => {
      const { stock } = await readStock(pool, product);
      if (stock <= 0) return { outcome: 'sold_out', retries: 0 };
      await pay();
      // Refused when a newer lease holder already wrote: a paused holder
      // whose lease ran out cannot undo a newer sale.
      const written = await pool.query(
        `UPDATE ${TABLE} SET stock = $2, fence = $3 WHERE id = $1 AND fence <= $3`,
        [product, stock - 1, String(held.token)],
      );
      return { outcome: written.rowCount === 1 ? 'sold' : 'rejected', retries: 0 };
    });
  } catch (error) {
    if (error.code === 'LEASEHOLD_TIMEOUT') return { outcome: 'failed', retries: 0 };
    throw error;
  }
}

/** PostgreSQL's row lock: SELECT ... FOR UPDATE holds the row until COMMIT. */
async function rowLock({ pool }, product) {
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    const { stock } = await readStock(client, product, 'FOR UPDATE');
    if (stock <= 0) {
      await client.query('COMMIT');
      return { outcome: 'sold_out', retries: 0 };
    }
    await pay();
    await client.query(`UPDATE ${TABLE} SET stock = $2 WHERE id = $1`, [product, stock - 1]);
    await client.query('COMMIT');
    return { outcome: 'sold', retries: 0 };
  } catch (error) {
    await client.query('ROLLBACK').catch(() => {});
    throw error;
  } finally {
    client.release();
  }
}

class VersionConflict extends Error {}

/**
 * Version compare-and-swap: the write only matches the version it read.
 * On a conflict p-retry tries again after a jittered, growing delay (1 ms
 * up to 50 ms), at most 100 times; then the order fails.
 */
async function optimistic({ pool }, product) {
  const { default: pRetry } = await import('p-retry');
  let attempts = 0;
  try {
    const outcome = await pRetry(
      async () => {
        attempts += 1;
        const { stock, version } = await readStock(pool, product);
        if (stock <= 0) return 'sold_out';
        await pay();
        const written = await pool.query(
          `UPDATE ${TABLE} SET stock = $2, version = version + 1 WHERE id = $1 AND version = $3`,
          [product, stock - 1, version],
        );
        if (written.rowCount === 0) throw new VersionConflict(`${product} changed since version ${version}`);
        return 'sold';
      },
      {
        retries: 100,
        minTimeout: 1,
        maxTimeout: 50,
        factor: 2,
        randomize: true,
        shouldRetry: ({ error }) => error instanceof VersionConflict,
      },
    );
    return { outcome, retries: attempts - 1 };
  } catch (error) {
    if (error instanceof VersionConflict) return { outcome: 'failed', retries: attempts - 1 };
    throw error;
  }
}

const STRATEGIES = { none, lease, 'row-lock': rowLock, optimistic };

module.exports = { STRATEGIES };
