#!/usr/bin/env bash
# The test command: starts the test servers it can, then runs every test.
#   bash scripts/test.sh [extra nextest args]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/test-services.sh
source scripts/test-services.sh
trap leasehold_stop_services EXIT
# Doc tests and the Node.js package first, so the run ends with nextest's
# summary of everything else.
cargo test --workspace --all-features --doc --quiet
# The npm package (bindings/node): install its dev tools from the npm
# registry, build the native addon (debug: faster to build than release;
# napi passes --target, so it builds into target/x86_64-unknown-linux-gnu),
# then node's test runner over every store exported above.
(
  cd bindings/node
  npm ci --no-audit --no-fund
  npm run build:debug
  npm test
)
cargo nextest run --workspace --all-features --no-fail-fast "$@"
