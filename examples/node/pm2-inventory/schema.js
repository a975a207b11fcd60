'use strict';
// The shop's one table. `version` is for the optimistic strategy, `fence`
// keeps the highest lease token that wrote the row (the lease strategy).

const TABLE = 'pm2_inventory_products';

async function createSchema(pool) {
  await pool.query(`CREATE TABLE IF NOT EXISTS ${TABLE} (
    id      text PRIMARY KEY,
    stock   bigint NOT NULL,
    version bigint NOT NULL DEFAULT 0,
    fence   bigint NOT NULL DEFAULT 0
  )`);
}

module.exports = { TABLE, createSchema };
