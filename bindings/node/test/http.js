'use strict';
// HTTP helpers of the middleware tests (express.test.js, limit.test.js).

const http = require('node:http');
const { setTimeout: sleep } = require('node:timers/promises');

/** Serves `app` on a free port; resolves to { base, close }. */
async function serve(app) {
  const server = http.createServer(app);
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    base: `http://127.0.0.1:${server.address().port}`,
    close: () => new Promise((resolve) => server.close(resolve)),
  };
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

module.exports = { serve, post, postThenDisconnect, eventually, gate };
