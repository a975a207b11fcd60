'use strict';
// The example's settings, from the environment:
//   LOCKS_URL   leasehold store (default: a SQLite file in the temp dir)
//   DATA_URL    mongodb://HOST:PORT/DB for the users (default: in memory)

const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { MemoryUsers } = require('./data/memory');
const { MongoUsers } = require('./data/mongo');

function locksUrl() {
  if (process.env.LOCKS_URL) return process.env.LOCKS_URL;
  const dir = path.join(os.tmpdir(), 'leasehold-express-users');
  fs.mkdirSync(dir, { recursive: true });
  return `sqlite://${path.join(dir, 'locks.db')}`;
}

/** The users' store named by DATA_URL (`database` if the URL names none). */
async function openData(database = 'express_users') {
  const url = process.env.DATA_URL;
  if (!url) return new MemoryUsers();
  if (!url.startsWith('mongodb://') && !url.startsWith('mongodb+srv://')) {
    throw new Error(`DATA_URL: expected a mongodb:// URL, got ${url}`);
  }
  return MongoUsers.open(url, database);
}

module.exports = { locksUrl, openData };
