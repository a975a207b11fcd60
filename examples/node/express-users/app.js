'use strict';
// The users API: POST /users creates a user and bumps the users counter —
// a multi-document write — under one lock on the collection, instead of an
// `isLocked` flag that two requests can both read as free.

const express = require('express');
const { lockRoute } = require('leasehold/express');

/** JSON for a user: tokens are bigints, exact as numbers below 2^53. */
const userJson = (user) => ({ ...user, created_token: Number(user.created_token) });

/**
 * The express app. `locks`: a leasehold Locks; `data`: MemoryUsers or
 * MongoUsers; `wait`: how long a create waits for the lock (0: answer 409 at
 * once); `stepDelayMs`: a pause between the check and the insert, to make
 * the window visible; `lock: false` serves the racy baseline.
 */
function createApp({ locks, data, lockKey = 'collection:users', ttl = '10s', wait = 0, stepDelayMs = 0, lock = true }) {
  const app = express();
  const underLock = lock ? [lockRoute(locks, { key: () => lockKey, ttl, wait })] : [];

  app.post('/users', express.json(), validate, ...underLock, async (req, res) => {
    const { username } = req.body;
    if (await data.findByUsername(username)) {
      return res.status(409).type('application/problem+json').send({
        type: 'username-taken', title: 'Username taken', status: 409, username,
      });
    }
    await new Promise((resolve) => setTimeout(resolve, stepDelayMs));
    // The fence: the counter keeps the highest token that wrote it, so a
    // request whose lease ran out meanwhile cannot write over a newer one.
    const token = req.lease?.token ?? 0n;
    const user = await data.create(username, token);
    if (user === null) {
      return res.status(409).type('application/problem+json').send({
        type: 'lease-lost', title: 'Lock lost before the write', status: 409,
      });
    }
    return res.status(201).json(userJson(user));
  });

  app.get('/users', async (req, res) => {
    res.json((await data.list()).map(userJson));
  });

  app.get('/stats', async (req, res) => {
    const { users, counter } = await data.stats();
    res.json({ users, counter: { value: counter.value, last_token: Number(counter.last_token) } });
  });

  return app;
}

/** Rejects a bad body before taking the lock. */
function validate(req, res, next) {
  const username = req.body?.username;
  if (typeof username !== 'string' || !/^[A-Za-z0-9_.-]{1,64}$/.test(username)) {
    return res.status(400).type('application/problem+json').send({
      type: 'invalid-username', title: 'username: 1 to 64 letters, digits, _ . -', status: 400,
    });
  }
  return next();
}

module.exports = { createApp };
