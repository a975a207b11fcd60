'use strict';
// Runs the users API:  node server.js   (settings: README.md)

const { Locks } = require('leasehold');
const { createApp } = require('./app');
const { locksUrl, openData } = require('./config');

async function main() {
  const locks = await Locks.open(locksUrl());
  const data = await openData();
  const app = createApp({
    locks,
    data,
    wait: process.env.WAIT ?? 0,
    ttl: process.env.TTL ?? '10s',
    stepDelayMs: Number(process.env.STEP_DELAY_MS ?? 0),
    lock: process.env.NO_LOCK !== '1',
  });
  const port = Number(process.env.PORT ?? 3000);
  const server = app.listen(port, '127.0.0.1', () => {
    console.log(`express-users on http://127.0.0.1:${server.address().port} (locks ${locksUrl()}, ${data.describe()})`);
  });
  const stop = () => {
    server.close();
    Promise.all([locks.close(), data.close()]).catch(() => {});
  };
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
}

main().catch((error) => {
  console.error(error);
  process.exitCode = 1;
});
