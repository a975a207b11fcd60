'use strict';
// The table of prisma/schema.prisma's Product model, created with SQL by
// ../inventory/run.js: the load run needs no migration engine (`prisma db
// push` would do the same with internet; see README.md).

const TABLE = 'prisma_inventory_products';

module.exports = { TABLE };
