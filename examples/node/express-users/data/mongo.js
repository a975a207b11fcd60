'use strict';
// The users and their counter on MongoDB, through the official driver: a
// `users` collection and a `counters` document, written together in a
// transaction (the driver's withTransaction retries transient errors).
// A server without transactions (a standalone mongod) gets the two writes
// one after the other, fenced counter first, and a notice at start-up.

const { MongoClient } = require('mongodb');

class MongoUsers {
  #client;
  #db;
  #transactions;

  constructor(client, db, transactions) {
    this.#client = client;
    this.#db = db;
    this.#transactions = transactions;
  }

  /** Connects to the database named in `url` (or `fallbackDb`). */
  static async open(url, fallbackDb) {
    // useBigInt64: int64 fields come back as bigint, like lease.token.
    const client = new MongoClient(url, { useBigInt64: true });
    const db = client.db(new URL(url).pathname.slice(1) || fallbackDb);
    const hello = await db.admin().command({ hello: 1 });
    const transactions = Boolean(hello.setName) || hello.msg === 'isdbgrid';
    if (!transactions) {
      console.warn('express-users: this MongoDB server has no transactions (not a replica set): ' +
        'a create writes the counter, then the user');
    }
    await db.collection('counters').updateOne(
      { _id: 'users' },
      { $setOnInsert: { value: 0, last_token: 0n } },
      { upsert: true },
    );
    return new MongoUsers(client, db, transactions);
  }

  describe() {
    return `users on MongoDB (database ${this.#db.databaseName})`;
  }

  async findByUsername(username) {
    return this.#db.collection('users').findOne({ username });
  }

  /**
   * Bumps the counter and inserts the user, fenced by `token`: refused
   * (null, nothing written) when a newer token already wrote.
   */
  async create(username, token) {
    const write = async (session) => {
      const counter = await this.#db.collection('counters').findOneAndUpdate(
        { _id: 'users', last_token: { $lte: token } },
        { $inc: { value: 1 }, $set: { last_token: token } },
        { session, returnDocument: 'after' },
      );
      if (counter === null) return null;
      const user = { _id: counter.value, username, created_token: token };
      await this.#db.collection('users').insertOne(user, { session });
      return { id: user._id, username, created_token: token };
    };
    if (!this.#transactions) return write(undefined);
    return this.#client.withSession((session) => session.withTransaction(() => write(session)));
  }

  async list() {
    const users = await this.#db.collection('users').find().sort({ _id: 1 }).toArray();
    return users.map(({ _id, username, created_token }) => ({ id: _id, username, created_token }));
  }

  async stats() {
    const counter = await this.#db.collection('counters').findOne({ _id: 'users' });
    const users = await this.#db.collection('users').countDocuments();
    return { users, counter: { value: counter.value, last_token: counter.last_token } };
  }

  /** Drops the whole database (the demo's throw-away one). */
  async drop() {
    await this.#db.dropDatabase();
  }

  async close() {
    await this.#client.close();
  }
}

module.exports = { MongoUsers };
