#!/usr/bin/env bash
# Installs the tarballs of `npm run dist` into a new application the way a
# user without Rust would, and runs it: PATH without cargo/rustc, npm
# offline (the cache holds what this package's `npm ci` fetched), then
# Locks.open + acquire/release on SQLite, the Express middleware, an ES
# module import, and the types under "moduleResolution" node16 and bundler.
#   bash scripts/smoke-tarballs.sh DIST-DIR     (scripts/node-examples.sh runs it)
set -euo pipefail
pkg=$(cd "$(dirname "$0")/.." && pwd)
dist=$(cd "${1:?usage: smoke-tarballs.sh DIST-DIR}" && pwd)
app=$(mktemp -d)
trap 'rm -rf "$app"' EXIT
cp "$pkg"/smoke-app/* "$app"/
node "$pkg/scripts/smoke-lockfile.js" "$app" express typescript @types/express @types/node

# Only node's and npm's folders and the system's: no ~/.cargo/bin.
path_without_rust=$(dirname "$(command -v node)"):$(dirname "$(command -v npm)"):/usr/bin:/bin
for tool in cargo rustc rustup; do
  if PATH=$path_without_rust command -v "$tool" >/dev/null; then
    echo "smoke-tarballs: $tool is still on the stripped PATH ($path_without_rust)" >&2
    exit 1
  fi
done

tarballs=("$dist"/leasehold-*.tgz)
echo "smoke-tarballs: npm install --offline ${tarballs[*]##*/}"
(cd "$app" && PATH=$path_without_rust npm install --offline --no-audit --no-fund --loglevel=error "${tarballs[@]}")
# No install scripts ran: none is declared by either package.
for p in "$app"/node_modules/leasehold/package.json "$app"/node_modules/leasehold-*/package.json; do
  node -e 'const s = require(process.argv[1]).scripts ?? {}; for (const k of ["preinstall", "install", "postinstall"]) if (s[k]) { console.error(`${process.argv[1]} declares ${k}`); process.exit(1); }' "$p"
done
(cd "$app" && PATH=$path_without_rust npm run --silent start && PATH=$path_without_rust npm run --silent typecheck)
echo "smoke-tarballs: the tarballs install and run without a Rust toolchain"
