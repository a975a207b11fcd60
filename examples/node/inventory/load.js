'use strict';
// The load: for each strategy, a fresh product with STOCK items, ORDERS
// purchase requests sent CONCURRENCY at a time to the shop, then the final
// stock read back. Prints a table like `leasehold demo`. Shared by
// pm2-inventory and prisma-inventory (through run.js).

/** Nearest-rank percentile of sorted values. */
function percentile(sorted, q) {
  if (sorted.length === 0) return 0;
  return sorted[Math.min(sorted.length, Math.max(1, Math.ceil(q * sorted.length))) - 1];
}

async function buy(base, strategy, product) {
  const started = performance.now();
  const res = await fetch(`${base}/buy`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ strategy, product }),
  });
  const body = await res.json();
  if (res.status !== 200) throw new Error(`shop answered ${res.status}: ${body.error}`);
  return { ...body, ms: performance.now() - started };
}

/** Runs one strategy's orders against the shop at `base`; returns its row of the table. */
async function runStrategy({ base, pool, runId, table: TABLE }, strategy, { orders, stock, concurrency }) {
  const product = `widget-${strategy}-${runId}`;
  await pool.query(`INSERT INTO ${TABLE} (id, stock) VALUES ($1, $2)`, [product, stock]);
  const replies = [];
  let next = 0;
  const started = performance.now();
  // CONCURRENCY clients, each sending its next order when the last returns.
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < orders) {
        next += 1;
        replies.push(await buy(base, strategy, product));
      }
    }),
  );
  const elapsed = performance.now() - started;
  const { rows } = await pool.query(`SELECT stock FROM ${TABLE} WHERE id = $1`, [product]);
  await pool.query(`DELETE FROM ${TABLE} WHERE id = $1`, [product]);
  const finalStock = Number(rows[0].stock);
  const sold = replies.filter((r) => r.outcome === 'sold').length;
  const latencies = replies.map((r) => r.ms).sort((a, b) => a - b);
  return {
    strategy,
    orders,
    sold,
    stock,
    finalStock,
    oversold: Math.max(0, sold - stock),
    lost: sold - (stock - finalStock),
    retries: replies.reduce((sum, r) => sum + r.retries, 0),
    ms: Math.round(elapsed),
    p50: percentile(latencies, 0.5),
    p99: percentile(latencies, 0.99),
    workers: new Set(replies.map((r) => r.pid)).size,
  };
}

const isSafe = (strategy) => strategy !== 'none';
const violates = (row) => row.oversold > 0 || row.lost !== 0;

function verdict(row) {
  if (!violates(row)) return 'correct';
  return isSafe(row.strategy) ? 'BROKEN' : 'RACE';
}

function printTable(rows) {
  const line = (cells, widths) =>
    cells.map((c, i) => (i === 0 ? String(c).padEnd(widths[i]) : String(c).padStart(widths[i]))).join(' ');
  const widths = [11, 6, 5, 8, 9, 5, 8, 7, 8, 8, 8];
  console.log(line(['strategy', 'orders', 'sold', 'stock', 'oversold', 'lost', 'retries', 'ms', 'p50 ms', 'p99 ms', 'verdict'], widths));
  for (const r of rows) {
    console.log(
      line(
        [r.strategy, r.orders, r.sold, `${r.stock}→${r.finalStock}`, r.oversold, r.lost, r.retries, r.ms,
          r.p50.toFixed(2), r.p99.toFixed(2), verdict(r)],
        widths,
      ),
    );
  }
  console.log('\noversold = sales beyond the initial stock; lost = sales not reflected in the final stock');
}

module.exports = { runStrategy, printTable, violates, isSafe };
