'use strict';
// The shop's one table (created by ../inventory/run.js). `version` is for
// the optimistic strategy, `fence` keeps the highest lease token that wrote
// the row (the lease strategy).

const TABLE = 'pm2_inventory_products';

module.exports = { TABLE };
