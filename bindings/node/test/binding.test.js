'use strict';
// How the package finds its native addon (lib/binding.js): the local build,
// else the platform package npm installed, else one error that names the
// platform and the ways out. Each case runs against a copy of the package's
// JavaScript in a temporary folder, outside this checkout's node_modules.

const test = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { platformName } = require('../lib/binding');

const PACKAGE = path.resolve(__dirname, '..');
const NAME = platformName();
const VERSION = require('../package.json').version;
const LOCAL_ADDON = path.join(PACKAGE, `leasehold.${NAME}.node`);

/** A folder holding node_modules/leasehold (its JavaScript only, no addon); returns the app folder. */
function scratchApp(t) {
  const app = fs.mkdtempSync(path.join(os.tmpdir(), 'leasehold-binding-'));
  t.after(() => fs.rmSync(app, { recursive: true, force: true }));
  const copy = path.join(app, 'node_modules', 'leasehold');
  for (const entry of ['package.json', 'index.js', 'express.js', 'lib']) {
    fs.cpSync(path.join(PACKAGE, entry), path.join(copy, entry), { recursive: true });
  }
  return app;
}

/** Adds node_modules/leasehold-<platform> with `version`, holding the local build if `addon`. */
function platformPackage(app, version, addon) {
  const dir = path.join(app, 'node_modules', `leasehold-${NAME}`);
  fs.mkdirSync(dir, { recursive: true });
  const file = `leasehold.${NAME}.node`;
  fs.writeFileSync(path.join(dir, 'package.json'), JSON.stringify({ name: `leasehold-${NAME}`, version, main: file }));
  if (addon) fs.copyFileSync(LOCAL_ADDON, path.join(dir, file));
}

function requireIn(app) {
  const script = `
    try {
      const { Locks } = require('leasehold');
      const { lockRoute } = require('leasehold/express');
      console.log('loaded', typeof Locks.open, typeof lockRoute);
    } catch (e) {
      console.log(JSON.stringify({ code: e.code, message: e.message }));
    }`;
  const child = spawnSync(process.execPath, ['-e', script], { cwd: app, encoding: 'utf8' });
  assert.equal(child.status, 0, child.stderr);
  return child.stdout.trim();
}

test('with neither a local build nor the platform package, one error names the platform and both ways out', (t) => {
  const out = JSON.parse(requireIn(scratchApp(t)));
  assert.equal(out.code, 'LEASEHOLD_NO_NATIVE_ADDON');
  assert.match(out.message, new RegExp(`no native addon for this platform \\(${NAME}, Node\\.js `));
  assert.match(out.message, new RegExp(`leasehold-${NAME}@${VERSION.replace(/\./g, '\\.')}`));
  assert.match(out.message, /--omit=optional/);
  assert.match(out.message, /build it from source with a Rust toolchain: see "Contributing \/ building" in the leasehold README$/);
  assert.doesNotMatch(out.message, /Require stack|Cannot find module/);
});

test('the platform package installed by npm is loaded', (t) => {
  assert.ok(fs.existsSync(LOCAL_ADDON), 'needs the local build (npm run build:debug)');
  const app = scratchApp(t);
  platformPackage(app, VERSION, true);
  assert.equal(requireIn(app), 'loaded function function');
});

test('a platform package of another version is refused, with the fix', (t) => {
  const app = scratchApp(t);
  platformPackage(app, '0.0.1', true);
  const out = JSON.parse(requireIn(app));
  assert.equal(
    out.message,
    `leasehold: leasehold-${NAME}@0.0.1 is installed, but leasehold@${VERSION} needs leasehold-${NAME}@${VERSION}: run npm install again`,
  );
});

test('a local build next to index.js comes first', (t) => {
  const app = scratchApp(t);
  platformPackage(app, '0.0.1', false);
  fs.copyFileSync(LOCAL_ADDON, path.join(app, 'node_modules', 'leasehold', `leasehold.${NAME}.node`));
  assert.equal(requireIn(app), 'loaded function function');
});

test('platform names follow napi-rs', () => {
  assert.equal(platformName('linux', 'x64', false), 'linux-x64-gnu');
  assert.equal(platformName('linux', 'arm64', true), 'linux-arm64-musl');
  assert.equal(platformName('darwin', 'arm64'), 'darwin-arm64');
  assert.equal(platformName('win32', 'x64'), 'win32-x64-msvc');
});
