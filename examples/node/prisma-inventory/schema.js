'use strict';
// The table of prisma/schema.prisma's Product model, created with SQL: the
// load run needs no migration engine (`prisma db push` would do the same
// with internet; see README.md).

const TABLE = 'prisma_inventory_products';

async function createSchema(pool) {
  await pool.query(`CREATE TABLE IF NOT EXISTS ${TABLE} (
    id      text PRIMARY KEY,
    stock   bigint NOT NULL,
    version bigint NOT NULL DEFAULT 0,
    fence   bigint NOT NULL DEFAULT 0
  )`);
}

module.exports = { TABLE, createSchema };
