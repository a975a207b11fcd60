'use strict';
// A TCP relay in front of a real store server: `cut()` closes it and every
// connection through it, so a `Locks` opened through it sees its store go
// down (no mock: the store is real until the cut).

const net = require('node:net');

/** Starts a relay to the host:port of `url`; resolves to { url, cut }. */
async function relay(url) {
  const target = new URL(url);
  const sockets = new Set();
  const server = net.createServer((client) => {
    const upstream = net.connect(Number(target.port), target.hostname);
    for (const [a, b] of [[client, upstream], [upstream, client]]) {
      sockets.add(a);
      a.on('error', () => b.destroy());
      a.on('close', () => {
        sockets.delete(a);
        b.destroy();
      });
      a.pipe(b);
    }
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const through = new URL(url);
  through.host = `127.0.0.1:${server.address().port}`;
  return {
    url: through.toString(),
    cut() {
      server.close();
      for (const socket of sockets) socket.destroy();
    },
  };
}

module.exports = { relay };
