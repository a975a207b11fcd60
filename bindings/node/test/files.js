'use strict';
// Destroying an SQLite store under an open `Locks`, for tests of a store
// that fails for good.

const fs = require('node:fs');
const path = require('node:path');

// Garbage over every file of `dir`, written in place and none made
// shorter: SQLite maps its -shm file, and a mapped page that truncation
// cuts off is a SIGBUS for the whole process (seen: a test file's process
// died of it after all its tests had passed).
function destroyFilesInPlace(dir) {
  for (const file of fs.readdirSync(dir)) {
    const fd = fs.openSync(path.join(dir, file), 'r+');
    try {
      fs.writeSync(fd, Buffer.alloc(Math.max(8192, fs.fstatSync(fd).size), 7), 0, undefined, 0);
    } finally {
      fs.closeSync(fd);
    }
  }
}

module.exports = { destroyFilesInPlace };
