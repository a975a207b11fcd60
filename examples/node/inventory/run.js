'use strict';
// The driver of the inventory examples (pm2-inventory, prisma-inventory):
// starts an example's shop in a PM2 cluster, runs the load once per
// strategy, prints the table, then `pm2 kill`s its own PM2 daemon and checks
// that the daemon and every shop worker are gone. PM2 runs with a PM2_HOME
// in a temporary directory, so it neither sees nor touches any other PM2 on
// the machine. Each example's run.js calls `main` with its folder and table:
//   DATABASE_URL=postgres://… npm start
// Exits 1 if a safe strategy oversold or lost an update, or a process
// outlived `pm2 kill`.

const { execFileSync } = require('node:child_process');
const crypto = require('node:crypto');
const fs = require('node:fs');
const { createRequire } = require('node:module');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const { runStrategy, printTable, violates, isSafe } = require('./load');

const STRATEGIES = ['none', 'lease', 'row-lock', 'optimistic'];
const settings = {
  orders: Number(process.env.ORDERS ?? 200),
  stock: Number(process.env.STOCK ?? 100),
  concurrency: Number(process.env.CONCURRENCY ?? 16),
};

function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer().listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
    server.on('error', reject);
  });
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Whether PID has exited (a zombie, exited but not yet reaped, counts as gone). */
function isGone(pid) {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).startsWith('Z');
  } catch {
    return true;
  }
}

/** Polls `ok()` every 100 ms for up to `ms`; resolves to its last answer. */
async function waitFor(ok, ms) {
  const deadline = Date.now() + ms;
  for (;;) {
    if (await ok()) return true;
    if (Date.now() > deadline) return false;
    await sleep(100);
  }
}

/** The shop's one table: `version` is for the optimistic strategy, `fence` keeps the highest lease token that wrote the row. */
async function createSchema(pool, table) {
  await pool.query(`CREATE TABLE IF NOT EXISTS ${table} (
    id      text PRIMARY KEY,
    stock   bigint NOT NULL,
    version bigint NOT NULL DEFAULT 0,
    fence   bigint NOT NULL DEFAULT 0
  )`);
}

/** A PM2 of its own for the example in `dir` (its PM2 is a dev dependency there). */
class Pm2 {
  constructor(name, dir, env) {
    this.dir = dir;
    this.home = fs.mkdtempSync(path.join(os.tmpdir(), `${name}-`));
    this.env = { ...process.env, ...env, PM2_HOME: this.home };
  }

  run(...args) {
    const pm2 = path.join(this.dir, 'node_modules', '.bin', 'pm2');
    return execFileSync(pm2, args, { cwd: this.dir, env: this.env, encoding: 'utf8', stdio: 'pipe' });
  }

  /** The pids of the shop's workers, as PM2 reports them. */
  workerPids() {
    return JSON.parse(this.run('jlist')).map((app) => app.pid).filter((pid) => pid > 0);
  }

  daemonPid() {
    return Number(fs.readFileSync(path.join(this.home, 'pm2.pid'), 'utf8'));
  }

  /** The end of the shop's logs, for a failure message. */
  logs() {
    const dir = path.join(this.home, 'logs');
    if (!fs.existsSync(dir)) return '';
    return fs
      .readdirSync(dir)
      .map((f) => `--- ${f}\n${fs.readFileSync(path.join(dir, f), 'utf8').split('\n').slice(-20).join('\n')}`)
      .join('\n');
  }

  /** `pm2 kill` (once), then checks that every process it had is gone. */
  kill(pids) {
    this.killed ??= this.#kill(pids);
    return this.killed;
  }

  async #kill(pids) {
    try {
      this.run('kill');
    } catch (error) {
      console.error(`pm2 kill failed: ${error.message}`);
    }
    const gone = await waitFor(() => pids.every(isGone), 10_000);
    fs.rmSync(this.home, { recursive: true, force: true });
    return gone ? [] : pids.filter((pid) => !isGone(pid));
  }
}

/**
 * Runs the example `name` in `dir` (its ecosystem.config.js, its
 * node_modules) on the products table `table`.
 */
async function run({ name, dir, table }) {
  const databaseUrl = process.env.DATABASE_URL;
  if (!databaseUrl) throw new Error('set DATABASE_URL to a PostgreSQL URL, e.g. postgres://postgres@127.0.0.1:5432/postgres');
  // `pg` is the example's dependency, installed in its folder.
  const { Pool } = createRequire(path.join(dir, 'package.json'))('pg');
  const TABLE = table;
  const runId = crypto.randomBytes(4).toString('hex');
  const pool = new Pool({ connectionString: databaseUrl, max: 2 });
  await createSchema(pool, TABLE);

  const port = await freePort();
  const pm2 = new Pm2(name, dir, { DATABASE_URL: databaseUrl, PORT: String(port) });
  const base = `http://127.0.0.1:${port}`;
  let pids = [];
  const rows = [];
  let failed = false;
  // Ctrl-C reaches this process, not the detached PM2 daemon: stop it too,
  // remove this run's products, and exit; the run below is abandoned.
  let interrupted = false;
  for (const signal of ['SIGINT', 'SIGTERM']) {
    process.once(signal, () => {
      interrupted = true;
      Promise.allSettled([
        pm2.kill(pids),
        pool.query(`DELETE FROM ${TABLE} WHERE id LIKE $1`, [`%-${runId}`]),
      ]).finally(() => process.exit(130));
    });
  }
  try {
    pm2.run('start', 'ecosystem.config.js');
    pids = [pm2.daemonPid(), ...pm2.workerPids()];
    const up = await waitFor(() => fetch(`${base}/health`).then((r) => r.ok, () => false), 30_000);
    if (!up) throw new Error(`the shop did not answer on ${base}\n${pm2.logs()}`);
    console.log(
      `${name}: ${pids.length - 1} shop workers in a PM2 cluster on port ${port}, ` +
        `${settings.orders} orders for ${settings.stock} items per strategy, ${settings.concurrency} at a time`,
    );
    for (const strategy of STRATEGIES) {
      rows.push(await runStrategy({ base, pool, runId, table: TABLE }, strategy, settings));
    }
    printTable(rows);
    const served = Math.min(...rows.map((r) => r.workers));
    console.log(`each strategy's orders were answered by at least ${served} of the ${pids.length - 1} PM2 workers`);
  } catch (error) {
    if (interrupted) return;
    console.error(error.message);
    failed = true;
  }
  if (interrupted) return;
  const left = await pm2.kill(pids);
  if (left.length > 0) {
    console.error(`FAILED: still running after pm2 kill: ${left.join(' ')}`);
    failed = true;
  } else {
    console.log(`pm2 kill: the PM2 daemon and all ${pids.length - 1} shop workers are gone`);
  }
  await pool.end();
  const broken = rows.filter((r) => isSafe(r.strategy) && violates(r)).map((r) => r.strategy);
  if (broken.length > 0) {
    console.error(`FAILED: safe strategies oversold or lost updates: ${broken.join(', ')}`);
    failed = true;
  }
  if (failed) process.exitCode = 1;
}

/** Runs the example (see `run`); an error thrown is printed (exit code 1). */
function main(example) {
  run(example).catch((error) => {
    console.error(error);
    process.exitCode = 1;
  });
}

module.exports = { main };
