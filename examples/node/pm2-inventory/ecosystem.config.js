// PM2's description of the shop (../inventory/ecosystem.js): SHOP_INSTANCES
// (default 4) workers of shop.js in cluster mode, sharing one port. run.js
// starts it with `pm2 start ecosystem.config.js`.
module.exports = require('../inventory/ecosystem').shopApps('shop.js');
