#!/usr/bin/env bash
# The test command: starts the test servers it can, then runs every test.
#   bash scripts/test.sh [extra nextest args]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/test-services.sh
source scripts/test-services.sh
trap leasehold_stop_services EXIT
# Doc tests first (they include every code block of README.md and
# docs/*.md), then the runnable examples on each store and the Node.js
# package, so the run ends with nextest's summary of everything else.
cargo test --workspace --all-features --doc --quiet
# A failing example or npm test still lets the other tests run; the script
# fails after.
examples=0
bash scripts/examples.sh || examples=$?
# The npm package (bindings/node): install its dev tools from the npm
# registry, build the native addon (debug: faster to build than release)
# with the packages and features of the cargo commands around it, so it
# reuses their target/debug and compiles only the addon crate itself, then
# node's test runner over every store exported above.
# (Chained with &&: `set -e` does not apply inside a `( ... ) ||` subshell.)
node_package=0
(
  cd bindings/node &&
    npm ci --no-audit --no-fund &&
    npm run build:debug -- --workspace --all-features &&
    npm test
) || node_package=$?
[ "$node_package" != 0 ] || bash scripts/node-examples.sh || node_package=$?
# `leasehold dashboard` in headless Chromium (a few seconds): the binary
# with the feature set of the workspace builds around it, so it is reused.
browser=0
(
  cargo build --workspace --all-features --bin leasehold --quiet &&
    cd crates/leasehold-cli/tests/browser &&
    npm ci --no-audit --no-fund &&
    LEASEHOLD_BIN="$PWD/../../../../target/debug/leasehold" npm test
) || browser=$?
# A fresh MongoDB-compatible server for the suites (it slows down as the
# examples and the npm tests above fill it).
leasehold_restart_mongodb
cargo nextest run --workspace --all-features --no-fail-fast "$@"
if [ "$examples" != 0 ]; then
  echo "scripts/examples.sh failed (exit $examples): see its output above" >&2
  exit "$examples"
fi
if [ "$browser" != 0 ]; then
  echo "the dashboard's browser test (crates/leasehold-cli/tests/browser) failed (exit $browser): see its output above" >&2
  exit "$browser"
fi
if [ "$node_package" != 0 ]; then
  echo "bindings/node (npm ci, build or npm test) failed (exit $node_package): see its output above" >&2
  exit "$node_package"
fi
