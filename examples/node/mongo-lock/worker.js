'use strict';
// One worker process (started by run.js with child_process.fork):
//   node worker.js jobs  KEY REPORT_ID COUNT   run COUNT jobs, each under withLock
//   node worker.js hold  KEY                   take the lock and keep it until killed
//   node worker.js stale KEY REPORT_ID         take the lock, wait for "go", then write
// Every job is the same fenced write: the report document keeps the highest
// token that wrote it (`fence`) and refuses a lower one.

const { MongoClient } = require('mongodb');
const { Locks } = require('leasehold');
const { mongoUrl } = require('./config');

const [mode, key, reportId, count] = process.argv.slice(2);
const TTL = '1s';

/** The fenced write: matches only while no newer token has written. */
async function fencedAppend(reports, lease) {
  const result = await reports.updateOne(
    { _id: reportId, fence: { $lte: lease.token } },
    { $set: { fence: lease.token }, $push: { writes: { pid: process.pid, token: lease.token } } },
  );
  return result.matchedCount === 1;
}

function nextMessage() {
  return new Promise((resolve) => process.once('message', resolve));
}

async function main() {
  const url = mongoUrl();
  const locks = await Locks.open(url);
  // useBigInt64: int64 fields come back as bigint, like lease.token.
  const client = new MongoClient(url, { useBigInt64: true });
  const reports = client.db().collection('reports');
  try {
    if (mode === 'jobs') {
      for (let i = 0; i < Number(count); i++) {
        await locks.withLock(key, { ttl: TTL, wait: '30s' }, async (lease) => {
          // The job: read, work a little, write. Under the lock no other
          // worker interleaves; the fence guards the write anyway.
          await reports.findOne({ _id: reportId });
          await new Promise((resolve) => setTimeout(resolve, 5));
          const written = await fencedAppend(reports, lease);
          process.send({ job: i, token: String(lease.token), written });
        });
      }
    } else if (mode === 'hold') {
      const lease = await locks.acquire(key, { ttl: TTL, wait: '30s' });
      process.send({ held: String(lease.token) });
      // Hold on until run.js kills this process: the lease is never released.
      await new Promise(() => setInterval(() => {}, 1000));
    } else if (mode === 'stale') {
      try {
        await locks.withLock(key, { ttl: TTL, wait: '30s' }, async (lease) => {
          process.send({ held: String(lease.token) });
          await nextMessage(); // run.js pauses this process (SIGSTOP) before it says "go"
          // A stale holder that does not call lease.check() first: the fence
          // is what stops its write.
          const written = await fencedAppend(reports, lease);
          process.send({ token: String(lease.token), written, lost: lease.isLost() });
        });
        process.send({ withLock: 'resolved' });
      } catch (error) {
        process.send({ withLock: error.code ?? String(error) });
      }
    } else {
      throw new Error(`unknown mode ${mode}`);
    }
  } finally {
    await client.close();
    await locks.close();
  }
}

main().catch((error) => {
  console.error(`worker ${process.pid}: ${error.stack ?? error}`);
  process.exitCode = 1;
});
