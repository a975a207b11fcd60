#!/usr/bin/env bash
# The test command: starts the test servers it can, then runs every test.
#   bash scripts/test.sh [extra nextest args]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/test-services.sh
source scripts/test-services.sh
trap leasehold_stop_services EXIT
# Doc tests first (they include every code block of README.md and
# docs/*.md), then the runnable examples on each store, so the run ends
# with nextest's summary of everything else.
cargo test --workspace --all-features --doc --quiet
# A failing example still lets the other tests run; the script fails after.
examples=0
bash scripts/examples.sh || examples=$?
cargo nextest run --workspace --all-features --no-fail-fast "$@"
if [ "$examples" != 0 ]; then
  echo "scripts/examples.sh failed (exit $examples): see its output above" >&2
  exit "$examples"
fi
