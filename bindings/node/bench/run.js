'use strict';
// `npm run bench`: leasehold-node next to the Rust library (`leasehold
// bench`, same store, same run) and next to redlock and redis-semaphore on
// the same Redis: uncontended acquire+release p50/p99 and hand-off p50.
//
//   npm run bench [-- --rounds 1000]
//
// Stores: memory, SQLite, and PostgreSQL/Redis/MongoDB when
// LEASEHOLD_TEST_POSTGRES / _REDIS / _MONGODB are set (as for `npm test`).
// `npm run bench` builds the release addon first; figures from a debug
// addon are not worth printing.

const os = require('node:os');
const { parseArgs } = require('node:util');
const { stores } = require('../test/stores');
const { summarize } = require('./stats');
const leaseholdNode = require('./leasehold-node');
const rust = require('./rust');
const peers = require('./redis-peers');

const { values } = parseArgs({ options: { rounds: { type: 'string', default: '1000' } } });
const rounds = Number(values.rounds);
if (!Number.isInteger(rounds) || rounds < 10) throw new Error('--rounds must be an integer of at least 10');
// As `leasehold bench`: a tenth as many hand-offs, at least 20.
const handoffRounds = Math.max(20, Math.floor(rounds / 10));

const fmt = (us) => (us >= 10_000 ? `${(us / 1000).toFixed(0)} ms` : us >= 1000 ? `${(us / 1000).toFixed(2)} ms` : `${us.toFixed(0)} µs`);
const ratio = (a, b) => (a / b).toFixed(2);

function row(store, name, uncontended, handoff) {
  return `| ${store} | ${name} | ${fmt(uncontended.p50_us)} | ${fmt(uncontended.p99_us)} | ${handoff ? fmt(handoff.p50_us) : '–'} |`;
}

async function main() {
  const cli = rust.buildCli();
  const cpus = os.cpus();
  console.log(`# leasehold-node bench, ${new Date().toISOString()}`);
  console.log(`${cpus.length} × ${cpus[0]?.model ?? 'cpu'}, load average ${os.loadavg().map((l) => l.toFixed(2)).join(' ')}, Node ${process.version}, ${rounds} uncontended rounds and ${handoffRounds} hand-offs per row\n`);
  const lines = ['| store | lock | uncontended p50 | uncontended p99 | hand-off p50 |', '|---|---|---|---|---|'];
  const checks = [];
  for (const store of stores()) {
    // Rust first, then Node, back to back on the same store.
    const r = rust.measure(cli, store.url, rounds);
    const n = await leaseholdNode.measure(store.url, { rounds, handoffRounds, shared: store.shared });
    const nu = summarize(n.uncontended);
    const nh = summarize(n.handoff);
    lines.push(row(store.name, 'leasehold (Rust)', r.uncontended, r.handoff));
    lines.push(row(store.name, 'leasehold-node', nu, nh));
    checks.push(`${store.name}: leasehold-node p50 = ${ratio(nu.p50_us, r.uncontended.p50_us)}× Rust (target ≤ 1.3×); hand-off p50 ${ratio(nh.p50_us, r.handoff.p50_us)}× Rust`);
    if (store.name === 'redis') {
      for (const [name, run] of [['redlock 4', peers.redlock], ['redis-semaphore', peers.redisSemaphore]]) {
        const p = await run(store.url, { rounds, handoffRounds });
        const pu = summarize(p.uncontended);
        const ph = summarize(p.handoff);
        lines.push(row(store.name, name, pu, ph));
        checks.push(`redis: ${name} uncontended p50 = ${ratio(pu.p50_us, nu.p50_us)}× leasehold-node's; its hand-off p50 = ${ratio(ph.p50_us, nh.p50_us)}× leasehold-node's${name.startsWith('redlock') ? ' (targets: ≥ 1× and ≥ 10×)' : ''}`);
      }
    }
  }
  console.log(lines.join('\n'));
  console.log(`\n${checks.map((c) => `- ${c}`).join('\n')}`);
  console.log(`\nload average after: ${os.loadavg().map((l) => l.toFixed(2)).join(' ')}`);
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
