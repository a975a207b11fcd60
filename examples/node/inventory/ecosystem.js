'use strict';
// PM2's description of an inventory example's shop: SHOP_INSTANCES
// (default 4) workers of `script` in cluster mode, sharing one port. Each
// example's ecosystem.config.js names its script; the environment is read
// when PM2 loads that file.

/** The PM2 apps of a shop whose workers run `script`. */
function shopApps(script) {
  return {
    apps: [
      {
        name: 'shop',
        script,
        exec_mode: 'cluster',
        instances: Number(process.env.SHOP_INSTANCES ?? 4),
        autorestart: false,
        env: {
          DATABASE_URL: process.env.DATABASE_URL,
          LOCKS_URL: process.env.LOCKS_URL ?? '',
          PORT: process.env.PORT ?? '3000',
          PAY_MS: process.env.PAY_MS ?? '5',
        },
      },
    ],
  };
}

module.exports = { shopApps };
