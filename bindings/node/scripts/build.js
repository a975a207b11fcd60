'use strict';
// `npm run build` / `npm run build:debug`: compiles the addon with a plain
// `cargo build -p leasehold-node`, into the workspace's own target/debug or
// target/release, so it reuses every dependency `cargo build --workspace`
// already compiled. (`napi build` always passes `--target`, which makes
// cargo build every dependency a second time under target/<triple>/.)
// napi-rs's own library then writes native.js and native.d.ts, as `napi
// build --platform --js native.js --dts native.d.ts` does.
//
//   node scripts/build.js [--release | --profile NAME] [CARGO-ARGS...]
//
// `--profile dist` (what `npm run dist` uses) is the workspace's stripped
// release profile for published addons, built into target/dist.
// `--output-dir DIR` puts the addon in DIR instead of next to index.js.
//
// Other arguments go to cargo. By default only this crate and what it needs
// are built; a build that shares the target directory with other cargo
// commands should select packages and features as they do (e.g.
// `--workspace --all-features`, as scripts/test.sh passes), because cargo
// compiles a dependency again for every distinct feature set.

const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');

const PACKAGE_DIR = path.resolve(__dirname, '..');
const CRATE = 'leasehold-node';

/** Runs a command, failing the build with its exit code. */
function run(command, args, options = {}) {
  const child = spawnSync(command, args, { cwd: PACKAGE_DIR, encoding: 'utf8', maxBuffer: 256 << 20, ...options });
  if (child.error) throw child.error;
  if (child.status !== 0) {
    process.stderr.write(child.stderr ?? '');
    process.exit(child.status ?? 1);
  }
  return child.stdout;
}

/** The rustc host triple, e.g. x86_64-unknown-linux-gnu. */
function hostTriple() {
  const line = run('rustc', ['-vV']).split('\n').find((l) => l.startsWith('host: '));
  return line.slice('host: '.length).trim();
}

/** Builds the crate; returns the path of its cdylib. */
function cargoBuild(profile, cargoArgs, typeDefDir) {
  const env = { ...process.env, NAPI_TYPE_DEF_TMP_FOLDER: typeDefDir };
  // napi-derive writes the type definitions while it expands the crate's
  // macros: if they are missing, make cargo recompile the crate (napi-build
  // reruns on this variable, as under `napi build`).
  if (!fs.existsSync(path.join(typeDefDir, CRATE))) {
    env[`NAPI_FORCE_BUILD_${CRATE.toUpperCase().replace(/-/g, '_')}`] = String(Date.now());
  }
  const selects = cargoArgs.some((a) => a === '--workspace' || a === '-p' || a.startsWith('--package'));
  const args = ['build', ...(selects ? [] : ['-p', CRATE]), '--lib', '--message-format=json-render-diagnostics'];
  if (profile !== 'dev') args.push('--profile', profile);
  args.push(...cargoArgs);
  const out = run('cargo', args, { env, stdio: ['ignore', 'pipe', 'inherit'] });
  for (const line of out.split('\n')) {
    if (!line.startsWith('{')) continue;
    const message = JSON.parse(line);
    if (message.reason === 'compiler-artifact' && message.target.name === CRATE.replace(/-/g, '_') && message.target.kind.includes('cdylib')) {
      const lib = message.filenames.find((f) => /\.(so|dylib|dll)$/.test(f));
      if (lib) return lib;
    }
  }
  throw new Error(`cargo build did not report the ${CRATE} cdylib`);
}

async function main() {
  const args = process.argv.slice(2);
  let profile = 'dev';
  let outputDir = PACKAGE_DIR;
  const cargoArgs = [];
  for (let i = 0; i < args.length; i++) {
    if (args[i] === '--release') profile = 'release';
    else if (args[i] === '--profile') profile = args[++i];
    else if (args[i] === '--output-dir') outputDir = path.resolve(args[++i]);
    else cargoArgs.push(args[i]);
  }
  const { generateTypeDef, writeJsBinding, parseTriple } = await import('@napi-rs/cli');
  const pkg = JSON.parse(fs.readFileSync(path.join(PACKAGE_DIR, 'package.json'), 'utf8'));
  const binaryName = pkg.napi.binaryName;
  const metadata = JSON.parse(run('cargo', ['metadata', '--no-deps', '--format-version', '1']));
  const typeDefDir = path.join(metadata.target_directory, 'napi-rs', `${CRATE}-type-defs-${profile}`);
  fs.mkdirSync(typeDefDir, { recursive: true });

  const lib = cargoBuild(profile, cargoArgs, typeDefDir);
  const target = parseTriple(hostTriple());
  fs.mkdirSync(outputDir, { recursive: true });
  const addon = path.join(outputDir, `${binaryName}.${target.platformArchABI}.node`);
  // Copy to a temporary name, then rename: a running process that loaded
  // the old addon keeps its file.
  fs.copyFileSync(lib, `${addon}.tmp`);
  fs.renameSync(`${addon}.tmp`, addon);

  const { exports, dts } = await generateTypeDef({ typeDefDir, cwd: PACKAGE_DIR, declareBindingTarget: true });
  fs.writeFileSync(path.join(PACKAGE_DIR, 'native.d.ts'), dts);
  await writeJsBinding({
    platform: true,
    idents: exports,
    jsBinding: 'native.js',
    binaryName,
    packageName: pkg.name,
    version: pkg.version,
    outputDir: PACKAGE_DIR,
  });
  console.log(`built ${path.relative(PACKAGE_DIR, addon)} (${profile}) from ${path.relative(PACKAGE_DIR, lib)}`);
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
