'use strict';
// The users and their counter in this process's memory: what the app uses
// when DATA_URL is unset (with the default SQLite lock store). One process
// only: run several app instances on MongoDB instead.
//
// Each call yields to the event loop first, as a database round trip does,
// so concurrent requests interleave between the check and the insert just as
// they would against a real database.

const roundTrip = () => new Promise((resolve) => setImmediate(resolve));

class MemoryUsers {
  #users = [];
  #counter = { value: 0, last_token: 0n };

  describe() {
    return 'users in memory';
  }

  async findByUsername(username) {
    await roundTrip();
    return this.#users.find((user) => user.username === username) ?? null;
  }

  /**
   * Bumps the counter and inserts the user, fenced by `token`: refused
   * (null, nothing written) when a newer token already wrote. Runs without
   * an await in between, so the two writes land together.
   */
  async create(username, token) {
    await roundTrip();
    if (this.#counter.last_token > token) return null;
    this.#counter = { value: this.#counter.value + 1, last_token: token };
    const user = { id: this.#counter.value, username, created_token: token };
    this.#users.push(user);
    return user;
  }

  async list() {
    await roundTrip();
    return [...this.#users];
  }

  async stats() {
    await roundTrip();
    return { users: this.#users.length, counter: { ...this.#counter } };
  }

  async close() {}
}

module.exports = { MemoryUsers };
