#!/usr/bin/env bash
# Installs the npm package's release tarballs into a new app (`npm run
# dist`, then bindings/node/scripts/smoke-tarballs.sh), then runs the
# Node.js examples (examples/node/*) end to end, as their READMEs say, and
# checks the exit code and the key lines of what each prints.
# Needs `npm ci` and the package built in bindings/node
# (npm run build:debug, as scripts/test.sh does) and the
# LEASEHOLD_TEST_* URLs that scripts/test-services.sh exports: the SQLite run
# always happens; the MongoDB and PostgreSQL runs are skipped with a notice
# when their server is missing, unless LEASEHOLD_REQUIRE_SERVERS=1.
# pm2-inventory and prisma-inventory share their driver (load, table, PM2
# control) in examples/node/inventory, which needs no install of its own.
#   bash scripts/node-examples.sh      (scripts/test.sh runs it)
#   bash scripts/node-examples.sh EXAMPLE...
#                                      only these examples (folder names),
#                                      against the debug build, without the
#                                      release tarballs
set -euo pipefail
cd "$(dirname "$0")/.."
examples=examples/node
started=$SECONDS
out=$(mktemp -d)
dist=$(mktemp -d)
trap 'rm -rf "$out" "$dist"' EXIT
only=("$@")

# wanted EXAMPLE: whether this run covers EXAMPLE (all without arguments).
wanted() {
  [ "${#only[@]}" = 0 ] && return 0
  local name
  for name in "${only[@]}"; do
    [ "$name" = "$1" ] && return 0
  done
  return 1
}
for name in "${only[@]}"; do
  [ -d "$examples/$name" ] || { echo "node examples: no example $name" >&2; exit 2; }
done

# The npm package as a user installs it: `npm run dist` builds the release
# addon (stripped) and writes the tarballs of `leasehold` and its platform
# package; a new app installs them with npm offline and no cargo/rustc on
# PATH, and runs the API, the Express middleware and the TypeScript types.
# The first dist build compiles every dependency in the `dist` profile
# (about 8 minutes on 2 cores); later ones relink the addon.
if [ "${#only[@]}" = 0 ]; then
  t=$SECONDS
  (cd bindings/node && npm run --silent dist -- --out "$dist")
  echo "node package: npm run dist took $((SECONDS - t)) s"
  bash bindings/node/scripts/smoke-tarballs.sh "$dist"
fi
t=$SECONDS

for example in express-users mongo-lock pm2-inventory; do
  wanted "$example" || continue
  (cd "$examples/$example" && npm ci --no-audit --no-fund --loglevel=error)
done
# --ignore-scripts: @prisma/engines' postinstall would download engines
# from outside npm (npm 11 does not run it unless approved; older npm does).
if wanted prisma-inventory; then
  (cd "$examples/prisma-inventory" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
fi
echo "node examples: npm ci took $((SECONDS - t)) s"

# run LABEL DIR NPM_SCRIPT [VAR=VALUE...]: runs `npm run NPM_SCRIPT` in the
# example's folder with the variables set, showing and keeping its output.
run() {
  local label=$1 dir=$2 script=$3
  shift 3
  local t=$SECONDS
  echo "== node example $label"
  local status=0
  (cd "$examples/$dir" && env "$@" npm run --silent "$script") 2>&1 | tee "$out/$label" || status=${PIPESTATUS[0]}
  if [ "$status" != 0 ]; then
    echo "node examples: $label failed (exit $status)" >&2
    return 1
  fi
  echo "== node example $label: $((SECONDS - t)) s"
}

# expect LABEL REGEX...: each extended regex matches a whole line of the output.
expect() {
  local label=$1 pattern
  shift
  for pattern in "$@"; do
    if ! grep -Eq "^($pattern)\$" "$out/$label"; then
      echo "node examples: $label printed no line matching: $pattern" >&2
      return 1
    fi
  done
}

# shellcheck source=scripts/store-url.sh
source scripts/store-url.sh

express_users_lines=(
  'reject mode \(wait 0\): 20 concurrent creates -> [0-9]+ x 201, [0-9]+ x 409 locked \(each with Retry-After and a problem\+json body\)'
  'wait mode \(wait 30s\): 20 concurrent creates -> 20 x 201'
  'same username 10 times at once: 1 x 201, 9 x 409 username taken'
  'stored: [0-9]+ users, counter [0-9]+, no duplicate usernames, tokens increase with ids'
  'all checks passed'
)

if wanted express-users; then
  run express-users-sqlite express-users demo LOCKS_URL= DATA_URL=
  expect express-users-sqlite 'express-users demo: locks on sqlite, users in memory' "${express_users_lines[@]}"
fi

mongodb=$(store_url "node examples" MONGODB)
if [ -n "$mongodb" ] && wanted express-users; then
  run express-users-mongodb express-users demo "LOCKS_URL=$mongodb" "DATA_URL=$mongodb"
  expect express-users-mongodb 'express-users demo: locks on mongodb, users on MongoDB .*' "${express_users_lines[@]}"
fi
if [ -n "$mongodb" ] && wanted mongo-lock; then
  run mongo-lock mongo-lock start "MONGODB_URL=$mongodb"
  expect mongo-lock \
    '1\. 3 workers x 5 jobs under withLock.*: 15 jobs, tokens [0-9]+\.\.[0-9]+, every fenced write accepted' \
    '2\. worker [0-9]+ killed \(SIGKILL\) holding token [0-9]+; lock taken over after [0-9]+ ms \(ttl 1000 ms\) with token [0-9]+' \
    '3\. worker [0-9]+ paused .* matched nothing: refused; its withLock rejected with LEASEHOLD_LOST' \
    'report [0-9a-f]+: 16 writes, tokens strictly increasing .*' \
    'all checks passed'
fi

postgres=$(store_url "node examples" POSTGRES)
# Both shops run under one driver (examples/node/inventory) with the same
# load, 200 orders for 100 items per strategy: the same table, the same end.
inventory_lines=(
  'none +200 +[0-9]+ .* RACE'
  'lease +200 +100 .* correct'
  'row-lock +200 +100 .* correct'
  'optimistic +200 +100 .* correct'
  'pm2 kill: the PM2 daemon and all 4 shop workers are gone'
)
if [ -n "$postgres" ] && wanted pm2-inventory; then
  run pm2-inventory pm2-inventory start "DATABASE_URL=$postgres"
  expect pm2-inventory "${inventory_lines[@]}"
fi
if [ -n "$postgres" ] && wanted prisma-inventory; then
  # `prisma generate` needs no schema engine but downloads one unless this
  # names an existing file; the proxy variables make any other download
  # attempt fail the run (the shop's own requests are to 127.0.0.1).
  run prisma-inventory prisma-inventory start "DATABASE_URL=$postgres" \
    "PRISMA_SCHEMA_ENGINE_BINARY=$(type -P true)" \
    HTTP_PROXY=http://127.0.0.1:9 HTTPS_PROXY=http://127.0.0.1:9 http_proxy=http://127.0.0.1:9 https_proxy=http://127.0.0.1:9 \
    NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost
  expect prisma-inventory "${inventory_lines[@]}"
fi
echo "node examples: all passed in $((SECONDS - started)) s"
