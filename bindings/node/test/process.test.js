'use strict';
// The process exits by itself (no native handle keeps it alive), and the
// package loads through both `require` and `import`. Each case runs in a
// child process of its own: the test runner would hide a hang.

const test = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const path = require('node:path');

const PACKAGE = path.resolve(__dirname, '..');
// Generous: a hang is what this catches, not slowness.
const LIMIT_MS = 20_000;

function run(args, script) {
  const started = Date.now();
  const child = spawnSync(process.execPath, [...args, script], { cwd: PACKAGE, timeout: LIMIT_MS, encoding: 'utf8' });
  return { ...child, elapsed: Date.now() - started };
}

// Runs `body` in an async function of a CommonJS child, with `locks` open
// on `memory://`.
function runWithLocks(body) {
  return run(['-e'], `
    const { Locks } = require('leasehold');
    (async () => {
      const locks = await Locks.open('memory://');
${body}
    })();`);
}

function assertExitsCleanly(child, expectedOutput) {
  assert.equal(child.error, undefined, `did not exit within ${LIMIT_MS} ms`);
  assert.equal(child.signal, null);
  assert.equal(child.stderr, '');
  assert.equal(child.status, 0);
  assert.equal(child.stdout.trim(), expectedOutput);
}

test('exits by itself when nothing is held or pending, without close()', () => {
  const child = runWithLocks(`
    const lease = await locks.acquire('k', { ttl: '30s', wait: '1s' });
    await lease.release();
    console.log('released');`);
  assertExitsCleanly(child, 'released');
});

test('exits by itself while a lease is still held, without close()', () => {
  const child = runWithLocks(`
    const lease = await locks.acquire('k', { ttl: '30s' });
    console.log('holding', lease.isLost());`);
  assertExitsCleanly(child, 'holding false');
  assert.ok(child.elapsed < 15_000, 'did not wait for the 30 s ttl');
});

test('exits by itself after close(), leases still held', () => {
  const child = runWithLocks(`
    const lease = await locks.acquire('k', { ttl: '30s' });
    lease.signal.addEventListener('abort', () => console.log('never: a close is not a loss'));
    await locks.close();
    console.log('closed', lease.isLost());`);
  assertExitsCleanly(child, 'closed true');
});

test('a lost lease in a process without handlers neither crashes nor hangs it', () => {
  const child = runWithLocks(`
    const lease = await locks.acquire('k', { ttl: 300 });
    await locks.forceRelease('k');
    await new Promise((resolve) => setTimeout(resolve, 1500));
    console.log('lost', lease.isLost(), lease.signal.aborted, lease.signal.reason.code);`);
  assertExitsCleanly(child, 'lost true true LEASEHOLD_LOST');
});

test('exits by itself after using a semaphore, permits still held', () => {
  const child = runWithLocks(`
    const sem = locks.semaphore('s', 2);
    const a = await sem.acquire({ ttl: '30s', wait: '1s' });
    const b = await sem.tryAcquire({ ttl: '30s' });
    a.signal.addEventListener('abort', () => console.log('never'));
    await sem.withPermit({ wait: 0 }, () => {}).catch((e) => console.log(e.code));
    console.log('slots', a.slot + b.slot, (await sem.holders()).length);`);
  assertExitsCleanly(child, 'LEASEHOLD_BUSY\nslots 1 2');
  assert.ok(child.elapsed < 15_000, 'did not wait for the 30 s ttl');
});

test('exits by itself after acquireMany, keys still held', () => {
  const child = runWithLocks(`
    const multi = await locks.acquireMany(['a', 'b'], { ttl: '30s', wait: '1s' });
    multi.signal.addEventListener('abort', () => console.log('never'));
    await locks.withLocks(['c', 'd'], {}, () => {});
    console.log('held', multi.tokens.size);`);
  assertExitsCleanly(child, 'held 2');
  assert.ok(child.elapsed < 15_000, 'did not wait for the 30 s ttl');
});

test('exits by itself after an election: leader held, observer left by break', () => {
  const child = runWithLocks(`
    const election = locks.election('e');
    const term = await election.campaign('me', { ttl: '30s' });
    term.signal.addEventListener('abort', () => console.log('never'));
    for await (const leader of election.observe()) {
      console.log('leader', leader.candidate);
      break;
    }
    console.log('done', (await election.leader()).candidate);`);
  assertExitsCleanly(child, 'leader me\ndone me');
  assert.ok(child.elapsed < 15_000, 'did not wait for the 30 s ttl');
});

test('exits by itself when close() ends an observer that waits for a leader', () => {
  const child = runWithLocks(`
    const iterator = locks.election('nobody').observe();
    const pending = iterator.next();
    setTimeout(() => locks.close(), 100);
    console.log('ended', (await pending).done);`);
  assertExitsCleanly(child, 'ended true');
});

test('loads with require and with import', () => {
  const cjs = run(['-e'], `console.log(typeof require('leasehold').Locks.open)`);
  assertExitsCleanly(cjs, 'function');
  const esm = run(['--input-type=module', '-e'], `
    import { Locks } from 'leasehold';
    import leasehold from 'leasehold';
    console.log(typeof Locks.open, leasehold.Locks === Locks);`);
  assertExitsCleanly(esm, 'function true');
});

// LEASEHOLD_NODE_WORKERS sizes the native runtime when the addon loads; a
// value that is not a positive integer must not be silently ignored.
function runWithWorkers(value, body) {
  const started = Date.now();
  const child = spawnSync(process.execPath, ['-e', `
    const { Locks } = require('leasehold');
    (async () => {
${body}
    })();`], { cwd: PACKAGE, timeout: LIMIT_MS, encoding: 'utf8', env: { ...process.env, LEASEHOLD_NODE_WORKERS: value } });
  return { ...child, elapsed: Date.now() - started };
}

test('LEASEHOLD_NODE_WORKERS: a positive integer sizes the runtime', () => {
  const child = runWithWorkers('3', `
      const locks = await Locks.open('memory://');
      const lease = await locks.acquire('k', { ttl: '30s' });
      await lease.release();
      console.log('ok');`);
  assertExitsCleanly(child, 'ok');
});

for (const bad of ['0', 'two', '-1', '']) {
  test(`LEASEHOLD_NODE_WORKERS=${JSON.stringify(bad)}: Locks.open rejects with LEASEHOLD_INVALID_INPUT`, () => {
    const child = runWithWorkers(bad, `
      try {
        await Locks.open('memory://');
        console.log('opened');
      } catch (error) {
        console.log(error.code, /LEASEHOLD_NODE_WORKERS/.test(error.message));
      }`);
    assertExitsCleanly(child, 'LEASEHOLD_INVALID_INPUT true');
  });
}
