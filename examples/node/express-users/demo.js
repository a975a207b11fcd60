'use strict';
// Sends concurrent creates to the API over real HTTP and checks what comes
// back and what is stored. Uses a fresh lock key and, on MongoDB, a fresh
// database (dropped at the end). Exits 1 if a check fails.
//   npm run demo                                          (SQLite locks, users in memory)
//   LOCKS_URL=mongodb://… DATA_URL=mongodb://… npm run demo   (both on MongoDB)

const crypto = require('node:crypto');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { Locks } = require('leasehold');
const { createApp } = require('./app');
const { openData } = require('./config');
const { check, runChecked } = require('../checks');

const CONCURRENT = 20;
const STEP_DELAY_MS = 100; // the window between the check and the insert
const runId = crypto.randomBytes(4).toString('hex');

/** Serves `app` on a free port; resolves to its base URL and a stop function. */
function serve(app) {
  return new Promise((resolve) => {
    const server = app.listen(0, '127.0.0.1', () => {
      resolve({ base: `http://127.0.0.1:${server.address().port}`, stop: () => server.close() });
    });
  });
}

async function createUser(base, username) {
  const res = await fetch(`${base}/users`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ username }),
  });
  return {
    status: res.status,
    type: res.headers.get('content-type'),
    retryAfter: res.headers.get('retry-after'),
    body: await res.json(),
  };
}

const count = (replies, status) => replies.filter((r) => r.status === status).length;

/** Starts an app instance with `options` on the shared locks and data. */
async function instance(shared, options) {
  return serve(createApp({ ...shared, stepDelayMs: STEP_DELAY_MS, ...options }));
}

async function main() {
  // The default store is a SQLite file, here a throw-away one.
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'express-users-demo-'));
  const locksUrl = process.env.LOCKS_URL || `sqlite://${path.join(tmp, 'locks.db')}`;
  const servers = [];
  const stores = [];
  let locks;
  try {
    locks = await Locks.open(locksUrl);
    const data = await openData(`express_users_demo_${runId}`);
    stores.push(data);
    const baseline = await openData(`express_users_demo_${runId}_nolock`);
    stores.push(baseline);
    const shared = { locks, data, lockKey: `collection:users:${runId}` };
    console.log(`express-users demo: locks on ${locksUrl.split('://')[0]}, ${data.describe()}`);

    // 1. Reject mode: one create holds the lock, the others are told to retry.
    const reject = await instance(shared, { wait: 0 });
    servers.push(reject);
    const rejected = await Promise.all(
      Array.from({ length: CONCURRENT }, (_, i) => createUser(reject.base, `reject-${i}`)),
    );
    const locked = rejected.filter((r) => r.status === 409);
    const wellFormed = locked.every(
      (r) =>
        Number(r.retryAfter) >= 1 &&
        r.type.startsWith('application/problem+json') &&
        r.body.key === shared.lockKey &&
        Number.isInteger(r.body.retryAfterMs),
    );
    check(count(rejected, 201) >= 1 && locked.length >= 1, 'reject mode: expected both 201 and 409 replies');
    check(count(rejected, 201) + locked.length === CONCURRENT, 'reject mode: a reply was neither 201 nor 409');
    check(wellFormed, 'reject mode: a 409 lacks Retry-After or its problem+json body');
    console.log(
      `reject mode (wait 0): ${CONCURRENT} concurrent creates -> ${count(rejected, 201)} x 201, ` +
        `${locked.length} x 409 locked${wellFormed ? ' (each with Retry-After and a problem+json body)' : ''}`,
    );

    // 2. Wait mode: every create gets its turn.
    const waiting = await instance(shared, { wait: '30s' });
    servers.push(waiting);
    const waited = await Promise.all(
      Array.from({ length: CONCURRENT }, (_, i) => createUser(waiting.base, `wait-${i}`)),
    );
    check(count(waited, 201) === CONCURRENT, 'wait mode: not every create succeeded');
    console.log(`wait mode (wait 30s): ${CONCURRENT} concurrent creates -> ${count(waited, 201)} x 201`);

    // 3. One username, sent 10 times at once: the lock makes check-then-insert safe.
    const contested = await Promise.all(Array.from({ length: 10 }, () => createUser(waiting.base, 'ada')));
    check(count(contested, 201) === 1, 'contested username: expected exactly one 201');
    console.log(
      `same username 10 times at once: ${count(contested, 201)} x 201, ` +
        `${contested.filter((r) => r.body.type === 'username-taken').length} x 409 username taken`,
    );

    // 4. The same race without the lock: the check-then-insert lets duplicates in.
    const unlocked = await instance({ locks, data: baseline }, { lock: false });
    servers.push(unlocked);
    const racy = await Promise.all(Array.from({ length: 10 }, () => createUser(unlocked.base, 'ada')));
    console.log(`without the lock: same username 10 times at once -> ${count(racy, 201)} users named ada`);

    // What is stored: no duplicates, the counter matches, tokens rise with ids.
    const users = await data.list();
    const { counter } = await data.stats();
    const names = new Set(users.map((u) => u.username));
    const tokensRise = users.every((u, i) => i === 0 || u.created_token > users[i - 1].created_token);
    const expected = count(rejected, 201) + CONCURRENT + 1;
    check(names.size === users.length, 'duplicate usernames stored');
    check(counter.value === users.length && users.length === expected, `counter ${counter.value}, users ${users.length}, expected ${expected}`);
    check(tokensRise, 'created_token does not increase with the user id');
    console.log(
      `stored: ${users.length} users, counter ${counter.value}, ` +
        `${names.size === users.length ? 'no duplicate usernames' : 'DUPLICATE usernames'}, ` +
        `tokens ${tokensRise ? 'increase' : 'do NOT increase'} with ids`,
    );
  } finally {
    for (const server of servers) server.stop();
    for (const store of stores) {
      await store.drop?.();
      await store.close();
    }
    await locks?.close();
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}

runChecked(main);
