'use strict';
// `npm run bench`: leasehold-node next to the Rust library (`leasehold
// bench`, same store, same run) and next to redlock and redis-semaphore on
// the same Redis: uncontended acquire+release p50/p99 and hand-off p50.
//
//   npm run bench [-- --rounds 500 --blocks 3]
//
// Stores: memory, SQLite, and PostgreSQL/Redis/MongoDB when
// LEASEHOLD_TEST_POSTGRES / _REDIS / _MONGODB are set (as for `npm test`).
// Each store runs `blocks` blocks, each side in turn within a block (Rust,
// Node, then the Redis peers), so drift in the machine's load hits every
// side alike; a figure is the median of that side's per-block figures.
// `npm run bench` builds the release addon first: figures from a debug
// addon are not worth printing.

const os = require('node:os');
const { parseArgs } = require('node:util');
const { stores } = require('../test/stores');
const { summarize } = require('./stats');
const leaseholdNode = require('./leasehold-node');
const rust = require('./rust');
const peers = require('./redis-peers');

const { values } = parseArgs({
  options: { rounds: { type: 'string', default: '500' }, blocks: { type: 'string', default: '3' } },
});
const rounds = Number(values.rounds);
const blocks = Number(values.blocks);
if (!Number.isInteger(rounds) || rounds < 10) throw new Error('--rounds must be an integer of at least 10');
if (!Number.isInteger(blocks) || blocks < 1) throw new Error('--blocks must be a positive integer');
// As `leasehold bench`: a tenth as many hand-offs, at least 20.
const handoffRounds = Math.max(20, Math.floor(rounds / 10));

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const fmt = (us) => (us >= 10_000 ? `${(us / 1000).toFixed(0)} ms` : us >= 1000 ? `${(us / 1000).toFixed(2)} ms` : `${us.toFixed(0)} µs`);
const ratio = (a, b) => `${(a / b).toFixed(2)}×`;
const load = () => os.loadavg().map((l) => l.toFixed(2)).join(' ');

const IOREDIS_PAIR = 'floor: SET NX PX + EVAL by hand (ioredis)';
const RUST_FLOOR = 'floor: the same pair on a blocking connection (Rust)';

/**
 * The sides measured on a store: name -> async () => { uncontended, handoff }
 * summaries. The Rust side also pushes its floor row (Redis) to `floors`.
 */
function sides(cli, store, floors) {
  const list = [
    ['leasehold (Rust)', async () => {
      const r = rust.measure(cli, store.url, rounds);
      // The floor row (Redis): `leasehold bench`'s blocking pair, same run.
      if (r.floor) floors.push(r.floor);
      return r;
    }],
    ['leasehold-node', async () => {
      const n = await leaseholdNode.measure(store.url, { rounds, handoffRounds, shared: store.shared });
      return { uncontended: summarize(n.uncontended), handoff: summarize(n.handoff) };
    }],
  ];
  if (store.name === 'redis') {
    for (const [name, run] of [['redlock 4', peers.redlock], ['redis-semaphore', peers.redisSemaphore]]) {
      list.push([name, async () => {
        const p = await run(store.url, { rounds, handoffRounds });
        return { uncontended: summarize(p.uncontended), handoff: summarize(p.handoff) };
      }]);
    }
    list.push([IOREDIS_PAIR, async () => {
      const p = await peers.ioredisPair(store.url, { rounds });
      return { uncontended: summarize(p.uncontended), handoff: null };
    }]);
  }
  return list;
}

async function main() {
  const cli = rust.buildCli();
  const cpus = os.cpus();
  console.log(`# leasehold-node bench, ${new Date().toISOString()}`);
  console.log(`${cpus.length} × ${cpus[0]?.model ?? 'cpu'}, load average ${load()} (1/5/15 min), Node ${process.version}; per store ${blocks} blocks of ${rounds} uncontended rounds and ${handoffRounds} hand-offs per side\n`);
  const lines = ['| store | lock | uncontended p50 | uncontended p99 | hand-off p50 |', '|---|---|---|---|---|'];
  const notes = [];
  for (const store of stores()) {
    const floors = [];
    const list = sides(cli, store, floors);
    const results = new Map(list.map(([name]) => [name, []]));
    for (let b = 0; b < blocks; b += 1) {
      for (const [name, measure] of list) results.get(name).push(await measure());
    }
    if (floors.length > 0) results.set(RUST_FLOOR, floors.map((f) => ({ uncontended: f, handoff: null })));
    const fig = {};
    for (const [name, runs] of results) {
      fig[name] = {
        p50: median(runs.map((r) => r.uncontended.p50_us)),
        p99: median(runs.map((r) => r.uncontended.p99_us)),
        handoff: runs[0].handoff ? median(runs.map((r) => r.handoff.p50_us)) : null,
      };
      const handoff = fig[name].handoff === null ? '–' : fmt(fig[name].handoff);
      lines.push(`| ${store.name} | ${name} | ${fmt(fig[name].p50)} | ${fmt(fig[name].p99)} | ${handoff} |`);
    }
    const node = fig['leasehold-node'];
    const rs = fig['leasehold (Rust)'];
    notes.push(`${store.name}: leasehold-node uncontended p50 ${ratio(node.p50, rs.p50)} the Rust API's (target ≤ 1.3×), ${node.p50 >= rs.p50 ? '+' : '−'}${fmt(Math.abs(node.p50 - rs.p50))}; hand-off p50 ${ratio(node.handoff, rs.handoff)}`);
    for (const floor of [RUST_FLOOR, IOREDIS_PAIR]) {
      if (fig[floor]) notes.push(`${store.name}: leasehold-node uncontended p50 ${ratio(node.p50, fig[floor].p50)} ${floor.slice('floor: '.length)}; the Rust API ${ratio(rs.p50, fig[floor].p50)}`);
    }
    for (const peer of ['redlock 4', 'redis-semaphore']) {
      if (!fig[peer]) continue;
      notes.push(`${store.name}: leasehold-node uncontended p50 ${ratio(node.p50, fig[peer].p50)} ${peer}'s${peer.startsWith('redlock') ? ' (target ≤ 1×)' : ''}; ${peer}'s hand-off p50 ${ratio(fig[peer].handoff, node.handoff)} leasehold-node's${peer.startsWith('redlock') ? ' (target ≥ 10×)' : ''}`);
    }
  }
  console.log(lines.join('\n'));
  console.log(`\n${notes.map((c) => `- ${c}`).join('\n')}`);
  console.log(`\nload average at the end: ${load()}`);
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
