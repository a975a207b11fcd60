'use strict';
// Writes a scratch application's package.json dependencies and
// package-lock.json for the named packages, copied from this package's own
// lockfile (same versions, tarball URLs and integrity): then
// `npm install --offline` needs only the tarballs that this package's
// `npm ci` put in npm's cache. (A plain `npm install --offline express@5.3.0`
// needs the registry's package metadata too, which `npm ci` never fetches.)
//
//   node scripts/smoke-lockfile.js APP-DIR NAME...

const fs = require('node:fs');
const path = require('node:path');

const [appDir, ...names] = process.argv.slice(2);
const { packages } = JSON.parse(fs.readFileSync(path.join(__dirname, '..', 'package-lock.json'), 'utf8'));

/** Where Node's resolution from the package at `from` finds `name` in the locked tree. */
function resolve(from, name) {
  for (let base = from; ; ) {
    const candidate = `${base ? `${base}/` : ''}node_modules/${name}`;
    if (packages[candidate]) return candidate;
    if (!base) return null;
    const parent = base.lastIndexOf('/node_modules/');
    base = parent < 0 ? '' : base.slice(0, parent);
  }
}

const picked = {};
function visit(location) {
  if (picked[location]) return;
  const { dev, devOptional, ...entry } = packages[location];
  picked[location] = entry;
  const optionalPeers = Object.keys(entry.peerDependenciesMeta ?? {}).filter((n) => entry.peerDependenciesMeta[n].optional);
  const required = [...Object.keys(entry.dependencies ?? {}), ...Object.keys(entry.peerDependencies ?? {}).filter((n) => !optionalPeers.includes(n))];
  for (const name of required) {
    const found = resolve(location, name);
    if (!found) throw new Error(`${location} needs ${name}, which the lockfile does not hold`);
    visit(found);
  }
  for (const name of Object.keys(entry.optionalDependencies ?? {})) {
    const found = resolve(location, name);
    if (found) visit(found);
  }
}

const dependencies = {};
for (const name of names) {
  const location = `node_modules/${name}`;
  if (!packages[location]) throw new Error(`${name} is not in package-lock.json`);
  dependencies[name] = packages[location].version;
  visit(location);
}
const app = JSON.parse(fs.readFileSync(path.join(appDir, 'package.json'), 'utf8'));
app.dependencies = { ...app.dependencies, ...dependencies };
fs.writeFileSync(path.join(appDir, 'package.json'), `${JSON.stringify(app, null, 2)}\n`);
const lock = {
  name: app.name,
  version: app.version,
  lockfileVersion: 3,
  requires: true,
  packages: { '': { name: app.name, version: app.version, dependencies }, ...picked },
};
fs.writeFileSync(path.join(appDir, 'package-lock.json'), `${JSON.stringify(lock, null, 2)}\n`);
console.log(`smoke app: ${Object.keys(picked).length} locked packages for ${names.join(', ')}`);
