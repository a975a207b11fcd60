'use strict';
// The Rust side, measured in the same run: `leasehold bench` (release
// build of the CLI, the library's own API) on the same store.

const { spawnSync } = require('node:child_process');
const path = require('node:path');

const REPO = path.resolve(__dirname, '..', '..', '..');

/**
 * Builds the release CLI (a no-op when it is fresh); returns its path.
 * Selected together with the addon, as `npm run bench` builds the addon,
 * so cargo resolves one feature set and compiles the dependencies once.
 */
function buildCli() {
  // `--bin leasehold` builds the CLI alone, while selecting both packages
  // keeps cargo's feature resolution identical to the addon's build, so no
  // dependency is compiled twice and the addon (whose build script reruns
  // on napi-rs's type-definition variable) is not rebuilt without it.
  const args = ['build', '--release', '-p', 'leasehold-cli', '-p', 'leasehold-node', '--bin', 'leasehold', '--message-format=json-render-diagnostics'];
  const child = spawnSync('cargo', args, {
    cwd: REPO,
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'inherit'],
    maxBuffer: 256 << 20,
  });
  if (child.status !== 0) throw new Error(`cargo ${args.join(' ')} failed (exit ${child.status})`);
  for (const line of child.stdout.split('\n')) {
    if (!line.startsWith('{')) continue;
    const message = JSON.parse(line);
    if (message.reason === 'compiler-artifact' && message.executable && message.target.name === 'leasehold') {
      return message.executable;
    }
  }
  throw new Error('cargo build did not report the leasehold binary');
}

/**
 * `leasehold bench --scenario uncontended --scenario handoff` on `url`:
 * uncontended acquire+release and the store-woken hand-off (it runs
 * rounds/10 hand-offs, at least 20).
 */
function measure(cli, url, rounds) {
  const child = spawnSync(
    cli,
    ['--store', url, 'bench', '--scenario', 'uncontended', '--scenario', 'handoff', '--rounds', String(rounds), '--json'],
    { encoding: 'utf8', maxBuffer: 64 << 20 },
  );
  if (child.status !== 0) throw new Error(`leasehold bench on ${url} failed (exit ${child.status}): ${child.stderr}`);
  const report = JSON.parse(child.stdout);
  // The floor on Redis: the same two commands on a blocking connection
  // (`leasehold bench`'s own baseline row), printed as the Node table's
  // baseline.
  const floor = report.scenarios.uncontended.baselines.find((b) => b.name.endsWith('(floor)'));
  return {
    uncontended: report.scenarios.uncontended.leasehold,
    floor,
    handoff: report.scenarios.handoff.notified,
    handoffRounds: report.scenarios.handoff.notified.samples,
  };
}

module.exports = { buildCli, measure };
