'use strict';
// `npm run dist`: the release workflow (.github/workflows/node-release.yml)
// for this machine's platform only, ending in tarballs instead of a publish:
//
//   1. build the addon with the workspace's `dist` profile (release,
//      stripped) into DIR/artifacts, as each matrix job of the workflow does;
//   2. in a staging copy of the package (DIR/stage), napi-rs's own
//      `napi artifacts` puts the addon into its platform package (npm/<platform>,
//      made by `napi create-npm-dirs`) and `napi pre-publish
//      --skip-optional-publish` writes the exact-version optionalDependencies
//      into package.json, as the workflow's publish job does;
//   3. `npm pack` writes DIR/leasehold-VERSION.tgz and
//      DIR/leasehold-<platform>-VERSION.tgz, installable with
//      `npm install ./leasehold-*.tgz`.
//
//   node scripts/dist.js [--out DIR] [CARGO-ARGS...]     (DIR: dist/)
//
// The staging copy keeps the checkout's package.json free of
// optionalDependencies that name packages not published yet.

const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');

const PACKAGE_DIR = path.resolve(__dirname, '..');

function run(command, args, cwd) {
  const child = spawnSync(command, args, { cwd, stdio: ['ignore', 'pipe', 'inherit'], encoding: 'utf8' });
  if (child.error) throw child.error;
  if (child.status !== 0) {
    process.stdout.write(child.stdout ?? '');
    throw new Error(`${command} ${args.join(' ')} failed (exit ${child.status})`);
  }
  return child.stdout;
}

function napi(args, cwd) {
  // The CLI colours its log lines; the output goes to our log as it is.
  process.stdout.write(run(process.execPath, [require.resolve('@napi-rs/cli/package.json').replace(/package\.json$/, 'dist/cli.js'), ...args], cwd));
}

async function main() {
  const args = process.argv.slice(2);
  let out = path.join(PACKAGE_DIR, 'dist');
  const cargoArgs = [];
  for (let i = 0; i < args.length; i++) {
    if (args[i] === '--out') out = path.resolve(args[++i]);
    else cargoArgs.push(args[i]);
  }
  const { parseTriple } = await import('@napi-rs/cli');
  const pkg = JSON.parse(fs.readFileSync(path.join(PACKAGE_DIR, 'package.json'), 'utf8'));
  fs.rmSync(out, { recursive: true, force: true });
  const artifacts = path.join(out, 'artifacts');

  // 1. The addon (the workflow's build job, for this one target).
  const started = Date.now();
  const build = spawnSync(process.execPath, [path.join(__dirname, 'build.js'), '--profile', 'dist', '--output-dir', artifacts, ...cargoArgs], {
    cwd: PACKAGE_DIR,
    stdio: 'inherit',
  });
  if (build.status !== 0) throw new Error(`the addon build failed (exit ${build.status})`);
  const buildSeconds = Math.round((Date.now() - started) / 1000);
  const [addon] = fs.readdirSync(artifacts).filter((f) => f.endsWith('.node'));
  const platform = addon.slice(`${pkg.napi.binaryName}.`.length, -'.node'.length);
  const triple = pkg.napi.targets.find((t) => parseTriple(t).platformArchABI === platform);
  if (!triple) throw new Error(`${platform} is not one of package.json's napi.targets`);

  // 2. A staging copy: the package's files, its README, and this platform's npm dir.
  const stage = path.join(out, 'stage');
  for (const entry of ['package.json', 'README.md', ...pkg.files]) {
    fs.cpSync(path.join(PACKAGE_DIR, entry.replace(/\/$/, '')), path.join(stage, entry), { recursive: true });
  }
  fs.cpSync(path.join(PACKAGE_DIR, 'npm', platform), path.join(stage, 'npm', platform), { recursive: true });
  // napi-rs's config for this run: the package's, with this one target.
  fs.writeFileSync(path.join(stage, 'napi.dist.json'), JSON.stringify({ ...pkg.napi, targets: [triple] }));
  napi(['artifacts', '-c', 'napi.dist.json', '--output-dir', artifacts, '--npm-dir', 'npm'], stage);
  napi(['pre-publish', '-c', 'napi.dist.json', '--npm-dir', 'npm', '-t', 'npm', '--skip-optional-publish', '--no-gh-release'], stage);

  // 3. The tarballs.
  const sizes = [];
  for (const dir of [stage, path.join(stage, 'npm', platform)]) {
    const [packed] = JSON.parse(run('npm', ['pack', '--json', '--pack-destination', out], dir));
    sizes.push(`${packed.filename}: ${(packed.size / 1e6).toFixed(1)} MB packed, ${(packed.unpackedSize / 1e6).toFixed(1)} MB unpacked`);
  }
  fs.rmSync(stage, { recursive: true, force: true });
  console.log(`npm run dist: built the ${triple} addon (dist profile) in ${buildSeconds} s; in ${path.relative(process.cwd(), out) || '.'}:`);
  for (const line of sizes) console.log(`  ${line}`);
}

main().catch((error) => {
  console.error(error.message);
  process.exit(1);
});
