'use strict';
// Where the example runs: one MongoDB URL for the locks (leasehold's
// `leasehold_locks` collection) and the data (the `reports` collection),
// in the same database.

const DEFAULT_URL = 'mongodb://127.0.0.1:27017/leasehold_examples?directConnection=true';
const DEFAULT_DATABASE = 'leasehold_examples';

/** MONGODB_URL, with a database name added when the URL names none. */
function mongoUrl() {
  const url = new URL(process.env.MONGODB_URL || DEFAULT_URL);
  if (url.pathname === '' || url.pathname === '/') url.pathname = `/${DEFAULT_DATABASE}`;
  return url.toString();
}

module.exports = { mongoUrl };
