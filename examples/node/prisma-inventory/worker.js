'use strict';
// What PM2 starts in each cluster worker: PM2 runs JavaScript only (on
// Node 20), so register tsx's loader, then run the TypeScript shop (Prisma's
// generated client is TypeScript).
require('tsx/cjs');
require('./shop.ts');
