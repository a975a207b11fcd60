#!/usr/bin/env bash
# Runs the leasehold crate's examples (crates/leasehold/examples) against
# every store the test servers provide, as a user would run them. Needs the
# LEASEHOLD_TEST_* URLs that scripts/test-services.sh exports; a store
# without one is skipped with a notice, unless LEASEHOLD_REQUIRE_SERVERS=1.
#   bash scripts/examples.sh        (scripts/test.sh runs it)
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --quiet -p leasehold --all-features --examples
examples=target/debug/examples

# Runs example $2 with its store URL in variable $1 set from $3; labels the
# output so a failure names the store.
run() {
  local var=$1 example=$2 url=$3
  echo "== example $example on ${url%%://*}"
  env "$var=$url" "$examples/$example"
}

# shellcheck source=scripts/store-url.sh
source scripts/store-url.sh

sqlite_dir=$(mktemp -d)
trap 'rm -rf "$sqlite_dir"' EXIT
run LOCKS_URL cron_guard "sqlite://$sqlite_dir/locks.db"
run LOCKS_URL axum_path_key "sqlite://$sqlite_dir/locks.db"

postgres=$(store_url "examples" POSTGRES)
if [ -n "$postgres" ]; then
  run LOCKS_URL cron_guard "$postgres"
  run DATABASE_URL postgres_fenced_write "$postgres"
  run LOCKS_URL axum_path_key "$postgres"
fi
redis=$(store_url "examples" REDIS)
if [ -n "$redis" ]; then
  run LOCKS_URL cron_guard "$redis"
fi
mongodb=$(store_url "examples" MONGODB)
if [ -n "$mongodb" ]; then
  run LOCKS_URL cron_guard "$mongodb"
fi
echo "examples: all passed"
