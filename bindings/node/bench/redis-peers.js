'use strict';
// The npm Redis locks people use today, on the same Redis: `redlock` (v4,
// the stable line; v5 has been in beta since 2022) and `redis-semaphore`'s
// Mutex, both over ioredis. Same two measurements as leasehold-node.

const { setTimeout: sleep } = require('node:timers/promises');
const Redis = require('ioredis');
const Redlock = require('redlock');
const { Mutex } = require('redis-semaphore');
const { timeRounds } = require('./stats');
const { HOLD_BEFORE_RELEASE_MS } = require('./leasehold-node');

const TTL_MS = 30_000;

function uniqueKey(what) {
  return `bench-node-peer:${what}:${process.pid}:${Math.random().toString(36).slice(2)}`;
}

/** Time from the holder's release call to the waiter holding the lock. */
async function handoffRounds(rounds, { take, wait, release }) {
  const samples = [];
  for (let i = 0; i < rounds; i += 1) {
    const held = await take();
    let acquiredAt;
    const waiting = wait().then((lock) => {
      acquiredAt = process.hrtime.bigint();
      return lock;
    });
    await sleep(HOLD_BEFORE_RELEASE_MS);
    const releasedAt = process.hrtime.bigint();
    await release(held);
    const next = await waiting;
    samples.push(acquiredAt - releasedAt);
    await release(next);
  }
  return samples;
}

/** redlock 4 with one Redis: no retries for the try, its defaults to wait. */
async function redlock(url, { rounds, handoffRounds: hRounds }) {
  const client = new Redis(url);
  const once = new Redlock([client], { retryCount: 0 });
  // Its defaults: 10 retries, 200 ms apart, up to 100 ms of jitter.
  const waiting = new Redlock([client]);
  try {
    const key = uniqueKey('redlock');
    const try1 = async () => (await once.lock(key, TTL_MS)).unlock();
    await timeRounds(Math.min(50, rounds), try1);
    const uncontended = await timeRounds(rounds, try1);
    const hkey = uniqueKey('redlock-handoff');
    const handoff = await handoffRounds(hRounds, {
      take: () => once.lock(hkey, TTL_MS),
      wait: () => waiting.lock(hkey, TTL_MS),
      release: (lock) => lock.unlock(),
    });
    return { uncontended, handoff };
  } finally {
    client.disconnect();
  }
}

/** redis-semaphore's Mutex: polls every `retryInterval` (default 10 ms). */
async function redisSemaphore(url, { rounds, handoffRounds: hRounds }) {
  const client = new Redis(url);
  try {
    const key = uniqueKey('semaphore');
    const try1 = async () => {
      const mutex = new Mutex(client, key, { lockTimeout: TTL_MS, acquireAttemptsLimit: 1 });
      await mutex.acquire();
      await mutex.release();
    };
    await timeRounds(Math.min(50, rounds), try1);
    const uncontended = await timeRounds(rounds, try1);
    const hkey = uniqueKey('semaphore-handoff');
    const handoff = await handoffRounds(hRounds, {
      take: async () => {
        const mutex = new Mutex(client, hkey, { lockTimeout: TTL_MS, acquireAttemptsLimit: 1 });
        await mutex.acquire();
        return mutex;
      },
      wait: async () => {
        const mutex = new Mutex(client, hkey, { lockTimeout: TTL_MS, acquireTimeout: 30_000 });
        await mutex.acquire();
        return mutex;
      },
      release: (mutex) => mutex.release(),
    });
    return { uncontended, handoff };
  } finally {
    client.disconnect();
  }
}

/** The compare-and-delete everyone writes (redlock's is the same). */
const UNLOCK = 'if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) else return 0 end';

/**
 * The floor from JS: `SET NX PX` and the compare-and-delete script by
 * hand over ioredis, the two round trips every lock above makes at least.
 * No hand-off (it has no wait).
 */
async function ioredisPair(url, { rounds }) {
  const client = new Redis(url);
  client.defineCommand('unlockIfOwner', { numberOfKeys: 1, lua: UNLOCK });
  try {
    const key = uniqueKey('pair');
    const try1 = async (i) => {
      const owner = `${process.pid}:${i}`;
      if ((await client.set(key, owner, 'PX', TTL_MS, 'NX')) !== 'OK') throw new Error('the key of the pair was busy');
      await client.unlockIfOwner(key, owner);
    };
    await timeRounds(Math.min(50, rounds), try1);
    return { uncontended: await timeRounds(rounds, try1) };
  } finally {
    client.disconnect();
  }
}

module.exports = { redlock, redisSemaphore, ioredisPair };
