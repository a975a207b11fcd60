// PM2's description of the shop: SHOP_INSTANCES (default 4) workers of
// shop.ts (through worker.js, which registers tsx's loader) in cluster
// mode, sharing one port.
// run.js starts it with `pm2 start ecosystem.config.js`; the environment is
// read when PM2 loads this file.
module.exports = {
  apps: [
    {
      name: 'shop',
      script: 'worker.js',
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
