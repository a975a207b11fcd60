'use strict';
// HTTP helpers of the middleware tests (express.test.js, limit.test.js).

const http = require('node:http');
const test = require('node:test');
const { setTimeout: sleep } = require('node:timers/promises');
const express = require('express');

/** Serves `app` on a free port; resolves to { base, close }. */
async function serve(app) {
  const server = http.createServer(app);
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    base: `http://127.0.0.1:${server.address().port}`,
    close: () => new Promise((resolve) => server.close(resolve)),
  };
}

/**
 * Serves an Express app to the tests of the current suite, from its
 * `before` to its `after`: `routes(app)` adds the routes, and an error
 * handler behind them records each error's message in `seen` and answers
 * 500 with it. Returns the server, whose `base` is set once the suite runs.
 */
function serveSuite(routes, seen) {
  const server = {};
  test.before(async () => {
    const app = express();
    routes(app);
    app.use((error, req, res, _next) => {
      seen.push({ error: error.message });
      res.status(500).json({ error: error.message });
    });
    Object.assign(server, await serve(app));
  });
  test.after(() => server.close());
  return server;
}

/** A POST that resolves to { status, headers, body (parsed JSON or text) }. */
async function post(url) {
  const response = await fetch(url, { method: 'POST' });
  const text = await response.text();
  let body = text;
  if (/json/.test(response.headers.get('content-type') ?? '')) body = JSON.parse(text);
  return { status: response.status, headers: response.headers, body };
}

/** Sends a POST and destroys the connection once `when` resolves. */
function postThenDisconnect(url, when) {
  const request = http.request(url, { method: 'POST' });
  request.on('error', () => {}); // the disconnect is the point
  request.end();
  return when.then(() => request.destroy());
}

/** Resolves when `check()` is true, rejects after `ms`. */
async function eventually(check, ms, what) {
  const deadline = Date.now() + ms;
  for (;;) {
    if (await check()) return;
    if (Date.now() > deadline) throw new Error(`not within ${ms} ms: ${what}`);
    await sleep(20);
  }
}

/** A promise with its resolve function, for handlers the test steps. */
function gate() {
  let open;
  const opened = new Promise((resolve) => {
    open = resolve;
  });
  return { open, opened };
}

module.exports = { serve, serveSuite, post, postThenDisconnect, eventually, gate };
