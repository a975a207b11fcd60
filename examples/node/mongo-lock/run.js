'use strict';
// The `findAndModify` job lock, done right: worker processes share one
// MongoDB lock through leasehold's `withLock`, and every write is fenced by
// the lease's token. Three acts, each checked; exits 1 if a check fails.
//   MONGODB_URL=mongodb://HOST:PORT/DB npm start

const { fork } = require('node:child_process');
const crypto = require('node:crypto');
const path = require('node:path');
const { MongoClient } = require('mongodb');
const { Locks } = require('leasehold');
const { mongoUrl } = require('./config');
const { check, runChecked } = require('../checks');

const WORKERS = 3;
const JOBS_PER_WORKER = 5;
const TTL_MS = 1000; // worker.js's ttl

const runId = crypto.randomBytes(4).toString('hex');
const key = `report:${runId}`;
const children = new Set();

/** Starts worker.js in `mode`; messages go to `onMessage(msg, child)`. */
function startWorker(mode, args, onMessage = () => {}) {
  const child = fork(path.join(__dirname, 'worker.js'), [mode, key, ...args]);
  child.on('message', (msg) => onMessage(msg, child));
  children.add(child);
  child.exited = new Promise((resolve) =>
    child.on('exit', (code, signal) => {
      children.delete(child);
      resolve({ code, signal });
    }),
  );
  return child;
}

function firstMessage(child, field) {
  return new Promise((resolve) => {
    const listener = (msg) => {
      if (msg[field] !== undefined) {
        child.off('message', listener);
        resolve(msg);
      }
    };
    child.on('message', listener);
  });
}

async function jobsAct() {
  const tokens = [];
  const workers = [];
  for (let w = 0; w < WORKERS; w++) {
    workers.push(startWorker('jobs', [runId, String(JOBS_PER_WORKER)], (msg) => tokens.push(msg)));
  }
  const exits = await Promise.all(workers.map((w) => w.exited));
  check(exits.every((e) => e.code === 0), `a jobs worker failed: ${JSON.stringify(exits)}`);
  check(tokens.every((t) => t.written), 'a job under the lock had its fenced write refused');
  const sorted = tokens.map((t) => BigInt(t.token)).sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
  console.log(
    `1. ${WORKERS} workers x ${JOBS_PER_WORKER} jobs under withLock('${key}'): ` +
      `${tokens.length} jobs, tokens ${sorted[0]}..${sorted[sorted.length - 1]}, every fenced write accepted`,
  );
}

async function crashAct(locks) {
  const holder = startWorker('hold', []);
  const { held } = await firstMessage(holder, 'held');
  holder.kill('SIGKILL');
  await holder.exited;
  const started = performance.now();
  // The killed worker never released: its lease runs out after the ttl.
  const lease = await locks.acquire(key, { ttl: TTL_MS, wait: '30s' });
  const waited = Math.round(performance.now() - started);
  check(lease.token > BigInt(held), `takeover token ${lease.token} is not above ${held}`);
  console.log(
    `2. worker ${holder.pid} killed (SIGKILL) holding token ${held}; ` +
      `lock taken over after ${waited} ms (ttl ${TTL_MS} ms) with token ${lease.token}`,
  );
  await lease.release();
}

async function staleAct(locks, reports) {
  const messages = [];
  const stale = startWorker('stale', [runId], (msg) => messages.push(msg));
  const { held } = await firstMessage(stale, 'held');
  // Pause the holder, as a GC pause, swapping or a frozen VM would: it stops
  // renewing, and its lease expires.
  stale.kill('SIGSTOP');
  const lease = await locks.acquire(key, { ttl: TTL_MS, wait: '30s' });
  const newer = lease.token;
  const wrote = await reports.updateOne(
    { _id: runId, fence: { $lte: newer } },
    { $set: { fence: newer }, $push: { writes: { pid: process.pid, token: newer } } },
  );
  check(wrote.matchedCount === 1, `the new holder's fenced write (token ${newer}) was refused`);
  await lease.release();
  stale.kill('SIGCONT');
  stale.send('go');
  const result = await firstMessage(stale, 'written');
  const { withLock } = await firstMessage(stale, 'withLock');
  await stale.exited;
  check(!result.written, `the stale write with token ${result.token} was accepted`);
  check(withLock === 'LEASEHOLD_LOST', `the stale worker's withLock ended with ${withLock}, not LEASEHOLD_LOST`);
  console.log(
    `3. worker ${stale.pid} paused (SIGSTOP) holding token ${held}; token ${newer} took over and wrote; ` +
      `resumed, its updateOne({ fence: { $lte: ${result.token} } }) ` +
      `${result.written ? 'was ACCEPTED' : 'matched nothing: refused'}; its withLock rejected with ${withLock}`,
  );
}

async function main() {
  const url = mongoUrl();
  const client = new MongoClient(url, { useBigInt64: true });
  const reports = client.db().collection('reports');
  const locks = await Locks.open(url);
  try {
    await reports.insertOne({ _id: runId, fence: 0n, writes: [] });
    await jobsAct();
    await crashAct(locks);
    await staleAct(locks, reports);

    const report = await reports.findOne({ _id: runId });
    const tokens = report.writes.map((w) => w.token);
    const increasing = tokens.every((t, i) => i === 0 || t > tokens[i - 1]);
    check(increasing, `the report's writes are not in strictly increasing token order: ${tokens.join(' ')}`);
    check(tokens.length === WORKERS * JOBS_PER_WORKER + 1, `the report has ${tokens.length} writes`);
    console.log(
      `report ${runId}: ${tokens.length} writes, tokens strictly increasing ` +
        `(${tokens[0]}..${tokens[tokens.length - 1]}), fence ${report.fence}`,
    );
    await reports.deleteOne({ _id: runId });
  } finally {
    // A failed act may leave a worker behind (one is paused in act 3).
    for (const child of children) child.kill('SIGKILL');
    await locks.close();
    await client.close();
  }
}

runChecked(main);
