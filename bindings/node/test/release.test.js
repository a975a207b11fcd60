'use strict';
// What a release relies on, checked without a network: one version across
// Cargo.toml, package.json and the platform packages; the platform packages
// are package.json's napi targets, each with os/cpu (and libc) fields; no
// install scripts; the lockfile in step with package.json (`npm ci` accepts
// some mismatches); the release workflow parses and builds every target.

const test = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const yaml = require('js-yaml');
const { PREBUILT } = require('../lib/binding');

const PACKAGE = path.resolve(__dirname, '..');
const ROOT = path.resolve(PACKAGE, '../..');
const pkg = JSON.parse(fs.readFileSync(path.join(PACKAGE, 'package.json'), 'utf8'));
const WORKFLOW = path.join(ROOT, '.github/workflows/node-release.yml');

async function platformOf(triple) {
  const { parseTriple } = await import('@napi-rs/cli');
  return parseTriple(triple).platformArchABI;
}

test('Cargo.toml, package.json, package-lock.json and every platform package carry one version', () => {
  const cargo = fs.readFileSync(path.join(ROOT, 'Cargo.toml'), 'utf8');
  const workspaceVersion = /\[workspace\.package\][^[]*?\nversion = "([^"]+)"/.exec(cargo)?.[1];
  assert.ok(workspaceVersion, 'the workspace version in Cargo.toml');
  assert.equal(pkg.version, workspaceVersion, 'package.json and Cargo.toml');
  const lock = JSON.parse(fs.readFileSync(path.join(PACKAGE, 'package-lock.json'), 'utf8'));
  assert.equal(lock.version, pkg.version, 'package-lock.json');
  for (const dir of fs.readdirSync(path.join(PACKAGE, 'npm'))) {
    const platform = JSON.parse(fs.readFileSync(path.join(PACKAGE, 'npm', dir, 'package.json'), 'utf8'));
    assert.equal(platform.version, pkg.version, `npm/${dir}/package.json`);
  }
});

test('the platform packages are the napi targets, each for one os and cpu', async () => {
  const expected = await Promise.all(pkg.napi.targets.map(platformOf));
  assert.deepEqual(fs.readdirSync(path.join(PACKAGE, 'npm')).sort(), [...expected].sort());
  assert.deepEqual([...PREBUILT].sort(), [...expected].sort(), 'lib/binding.js lists the same platforms');
  for (const platform of expected) {
    const manifest = JSON.parse(fs.readFileSync(path.join(PACKAGE, 'npm', platform, 'package.json'), 'utf8'));
    assert.equal(manifest.name, `leasehold-${platform}`);
    assert.deepEqual(manifest.files, [`leasehold.${platform}.node`]);
    assert.equal(manifest.main, `leasehold.${platform}.node`);
    assert.deepEqual(manifest.os, [platform.split('-')[0]]);
    assert.deepEqual(manifest.cpu, [platform.split('-')[1]]);
    if (platform.startsWith('linux-')) assert.deepEqual(manifest.libc, [platform.endsWith('-musl') ? 'musl' : 'glibc']);
  }
});

test('nothing runs at install time, and the main package ships no addon', () => {
  for (const script of ['preinstall', 'install', 'postinstall']) assert.equal(pkg.scripts[script], undefined, script);
  assert.ok(!pkg.files.some((f) => f.includes('.node')), 'files');
  assert.equal(pkg.scripts.prepublishOnly, 'napi pre-publish -t npm --no-gh-release');
});

test('native.d.ts (types generated from the Rust side, which index.d.ts imports) is committed as the build wrote it', (t) => {
  // The publish job packs the checkout without building, so the committed
  // file is what users get.
  const git = spawnSync('git', ['status', '--porcelain', '--', 'native.d.ts'], { cwd: PACKAGE, encoding: 'utf8' });
  if (git.status !== 0) return t.skip('not a git checkout');
  assert.ok(fs.existsSync(path.join(PACKAGE, 'native.d.ts')));
  assert.equal(git.stdout, '', 'commit the native.d.ts that npm run build wrote');
});

test('package-lock.json is what npm would write for package.json', (t) => {
  // `npm ci` accepts a lockfile whose root entry lacks package.json's
  // peerDependencies (npm install then rewrites it), so compare with npm's
  // own result. Offline: a dependency not in npm's cache fails here too.
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'leasehold-lock-'));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  for (const file of ['package.json', 'package-lock.json']) fs.copyFileSync(path.join(PACKAGE, file), path.join(dir, file));
  const npm = spawnSync('npm', ['install', '--package-lock-only', '--offline', '--ignore-scripts', '--no-audit', '--no-fund'], {
    cwd: dir,
    encoding: 'utf8',
  });
  assert.equal(npm.status, 0, npm.stderr);
  const written = fs.readFileSync(path.join(dir, 'package-lock.json'), 'utf8');
  assert.equal(written, fs.readFileSync(path.join(PACKAGE, 'package-lock.json'), 'utf8'), 'run `npm install` in bindings/node and commit package-lock.json');
});

test('the release workflow parses, builds and tests every target, and publishes with provenance', async () => {
  const workflow = yaml.load(fs.readFileSync(WORKFLOW, 'utf8'));
  const { build, test: smoke, publish } = workflow.jobs;
  const targets = [...pkg.napi.targets].sort();
  assert.deepEqual(build.strategy.matrix.settings.map((s) => s.target).sort(), targets);
  assert.deepEqual(smoke.strategy.matrix.settings.map((s) => s.target).sort(), targets);
  assert.deepEqual(smoke.needs, 'build');
  assert.equal(publish.needs, 'test');
  assert.equal(publish.permissions['id-token'], 'write', 'provenance needs an OIDC token');
  const buildStep = build.steps.find((s) => s.name === 'Build the addon (dist profile)');
  assert.match(buildStep.run, /napi build --platform --profile dist --target \$\{\{ matrix\.settings\.target \}\}/);
  // napi build must not overwrite the package's own index.js / index.d.ts.
  assert.match(buildStep.run, /--js native\.js --dts native\.d\.ts/);
  const publishRuns = publish.steps.map((s) => s.run ?? '').join('\n');
  assert.match(publishRuns, /npx napi artifacts --output-dir artifacts --npm-dir npm/);
  assert.match(publishRuns, /npm config set provenance true/);
  assert.match(publishRuns, /npm publish --access public/);
  for (const job of Object.values(workflow.jobs)) {
    for (const step of job.steps) if (step.uses) assert.match(step.uses, /@(v\d+|stable)$/, `${step.uses} names a release line`);
  }
});
