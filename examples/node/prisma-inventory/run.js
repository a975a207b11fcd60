'use strict';
// `npm start` (after `prisma generate`): the inventory driver shared with
// pm2-inventory (../inventory/run.js) on this example's shop
// (ecosystem.config.js) and table: the load once per strategy, the table,
// then `pm2 kill` and a check that every process is gone.
//   DATABASE_URL=postgres://… npm start

const { TABLE } = require('./schema');

require('../inventory/run').main({ name: 'prisma-inventory', dir: __dirname, table: TABLE });
