'use strict';
// Loads the native addon, the way napi-rs packages do: a local build next to
// index.js first (`npm run build` in a clone), else the prebuilt platform
// package npm installed as an optional dependency (`leasehold-linux-x64-gnu`,
// ...). Nothing is compiled or downloaded here or at install time. When
// neither exists, one error names the platform and the two ways out, instead
// of a stack of `require` failures.

const fs = require('node:fs');
const path = require('node:path');

const PACKAGE_DIR = path.join(__dirname, '..');
const BINARY_NAME = 'leasehold';

/**
 * The platforms a prebuilt package is published for (package.json's
 * `napi.targets`, as `napi create-npm-dirs` names them; a test checks that
 * they agree).
 */
const PREBUILT = [
  'linux-x64-gnu',
  'linux-x64-musl',
  'linux-arm64-gnu',
  'linux-arm64-musl',
  'darwin-x64',
  'darwin-arm64',
  'win32-x64-msvc',
];

/** Whether this Linux runs on musl (Alpine) rather than glibc. */
function isMusl() {
  // Node's diagnostic report names the glibc it runs on, and nothing on musl.
  const report = process.report?.getReport?.();
  const header = typeof report === 'string' ? JSON.parse(report).header : report?.header;
  return !header?.glibcVersionRuntime;
}

/** This platform's name in napi-rs's scheme: linux-x64-gnu, darwin-arm64, win32-x64-msvc, ... */
function platformName(platform = process.platform, arch = process.arch, musl = platform === 'linux' && isMusl()) {
  if (platform === 'linux') return `linux-${arch}-${musl ? 'musl' : 'gnu'}`;
  if (platform === 'win32') return `win32-${arch}-msvc`;
  return `${platform}-${arch}`;
}

/** Whether a `require` failed because `request` itself is not installed (not one of its own imports). */
function notFound(error, request) {
  return error?.code === 'MODULE_NOT_FOUND' && String(error.message).includes(`'${request}'`);
}

function missingError(name, version, cause) {
  const supported = PREBUILT.includes(name);
  const error = new Error(
    `leasehold: no native addon for this platform (${name}, Node.js ${process.versions.node}). ` +
      (supported
        ? `npm installs it as the optional dependency leasehold-${name}@${version}: reinstall without ` +
          `--omit=optional / --no-optional (if npm skipped it, delete node_modules and package-lock.json ` +
          `and run npm install again). `
        : `Prebuilt packages exist for ${PREBUILT.join(', ')}. `) +
      `Otherwise build it from source with a Rust toolchain: see "Contributing / building" in the leasehold README`,
    cause ? { cause } : undefined,
  );
  error.code = 'LEASEHOLD_NO_NATIVE_ADDON';
  return error;
}

let loaded;

/** The addon's exports (index.js and express.js share one load). */
function load() {
  loaded ??= find();
  return loaded;
}

function find() {
  const { version } = require('../package.json');
  const name = platformName();
  const local = path.join(PACKAGE_DIR, `${BINARY_NAME}.${name}.node`);
  if (fs.existsSync(local)) return require(local);
  const pkg = `${BINARY_NAME}-${name}`;
  let pkgVersion;
  try {
    pkgVersion = require(`${pkg}/package.json`).version;
  } catch (error) {
    if (notFound(error, `${pkg}/package.json`)) throw missingError(name, version);
    throw error;
  }
  // The JS and the addon are one release: a mismatched pair would fail in
  // obscure ways later (npm pins the exact version, a stale tree may not).
  if (pkgVersion !== version) {
    throw new Error(`leasehold: ${pkg}@${pkgVersion} is installed, but leasehold@${version} needs ${pkg}@${version}: run npm install again`);
  }
  return require(pkg);
}

module.exports = { load, platformName, PREBUILT };
