# Sourced by scripts/test-services.sh: provides LEASEHOLD_TEST_MONGODB.
#
# Keeps a URL that is already set. Otherwise starts a private
# MongoDB-wire-compatible server (SecantusDB from PyPI; no mongod package is
# available to the project) on a free port with a temporary data directory,
# and registers a stop hook. Failure to start leaves the variable unset and
# says so: the suites then skip, or fail under LEASEHOLD_REQUIRE_SERVERS=1.
# Must stay safe under the caller's `set -euo pipefail`.

LEASEHOLD_SECANTUS_VERSION="0.7.0b3"

leasehold_start_mongodb() {
  if [ -n "${LEASEHOLD_TEST_MONGODB:-}" ]; then
    echo "mongodb: using LEASEHOLD_TEST_MONGODB=$LEASEHOLD_TEST_MONGODB" >&2
    return 0
  fi
  if ! command -v secantusd-py >/dev/null 2>&1; then
    echo "mongodb: installing SecantusDB==$LEASEHOLD_SECANTUS_VERSION" >&2
    python3 -m pip install -q "SecantusDB==$LEASEHOLD_SECANTUS_VERSION" >&2 || true
    hash -r
  fi
  if ! command -v secantusd-py >/dev/null 2>&1; then
    echo "mongodb: secantusd-py not available; MongoDB tests will skip" >&2
    return 0
  fi
  local port dir pid
  port="$(leasehold_free_port)" || return 0
  dir="$(mktemp -d "${TMPDIR:-/tmp}/leasehold-mongodb.XXXXXX")" || return 0
  secantusd-py --host 127.0.0.1 --port "$port" --storage-path "$dir/data" \
    --log-level WARNING >"$dir/server.log" 2>&1 &
  pid=$!
  LEASEHOLD_STOP_HOOKS+=("kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf '$dir'")
  LEASEHOLD_MONGODB_STARTED="$pid $dir"
  local waited=0
  # The server imports its storage engine first: allow up to 30 s.
  until python3 -c 'import socket,sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1).close()' "$port" 2>/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null || [ "$waited" -ge 150 ]; then
      echo "mongodb: server did not start; log follows; MongoDB tests will skip" >&2
      tail -n 20 "$dir/server.log" >&2 || true
      return 0
    fi
    sleep 0.2
    waited=$((waited + 1))
  done
  export LEASEHOLD_TEST_MONGODB="mongodb://127.0.0.1:$port/?directConnection=true"
  echo "mongodb: SecantusDB $LEASEHOLD_SECANTUS_VERSION at $LEASEHOLD_TEST_MONGODB (pid $pid)" >&2
}

# leasehold_restart_mongodb: replaces the server this script started with a
# fresh one (new port, empty data directory); keeps a URL it did not start.
# SecantusDB slows down as a run fills it: on the same machine, a torture
# run of 7 s made 6-52 acquisitions on a server that had served the whole
# suite, and 138-162 on a fresh one (issue 25's notes).
leasehold_restart_mongodb() {
  [ -n "${LEASEHOLD_MONGODB_STARTED:-}" ] || return 0
  local pid dir
  read -r pid dir <<<"$LEASEHOLD_MONGODB_STARTED"
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rm -rf "$dir"
  unset LEASEHOLD_TEST_MONGODB LEASEHOLD_MONGODB_STARTED
  leasehold_start_mongodb
}

leasehold_start_mongodb
