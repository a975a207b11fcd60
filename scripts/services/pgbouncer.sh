# PgBouncer in transaction pooling mode in front of the test PostgreSQL:
# sourced by scripts/test-services.sh, started after every other service
# (it needs LEASEHOLD_TEST_POSTGRES; see LEASEHOLD_LATE_STARTS there).
#
# Exports LEASEHOLD_TEST_PGBOUNCER, the pooler's URL for the same database
# (the store URL adds `?pooler=transaction`), in this order of preference:
#   1. as already set by the caller;
#   2. a private PgBouncer on a free port of 127.0.0.1, its config, log and
#      pid file in a temp dir, stopped and deleted by leasehold_stop_services.
# It runs as user postgres when we are root (PgBouncer refuses root), with
# pool_mode = transaction, ignore_startup_parameters =
# extra_float_digits,options (as sqlx users set it) and trust auth for the
# URL's user, and a server pool of 4 connections so that clients really
# share server connections. Without PostgreSQL or the pgbouncer binary it
# prints a notice and leaves the variable unset (the tests then skip, or
# fail under LEASEHOLD_REQUIRE_SERVERS=1). In CI (CI=true, root, apt-get) it
# installs the `pgbouncer` package first.
#
# Also exports LEASEHOLD_TEST_PGBOUNCER_STRICT: a second instance left with
# PgBouncer's default ignore_startup_parameters (none), for the test that
# checks what a user sees when the pooler rejects sqlx's startup parameters.
#
# Everything runs inside functions called as `f || true`, so a failing probe
# never aborts a caller running under `set -euo pipefail`.

leasehold_pgbouncer_bin() {
  if command -v pgbouncer >/dev/null 2>&1; then
    command -v pgbouncer
  elif [ -x /usr/sbin/pgbouncer ]; then
    echo /usr/sbin/pgbouncer
  else
    return 1
  fi
}

# Starts a transaction-mode PgBouncer in DIR (which must exist) in front of
# LEASEHOLD_TEST_POSTGRES, with ignore_startup_parameters = IGNORE, registers
# its stop hook, and sets LEASEHOLD_PGBOUNCER_URL once it accepts connections.
leasehold_pgbouncer_start() {
  local dir=$1 ignore=$2 bin port runas="" user host pgport db
  bin=$(leasehold_pgbouncer_bin) || return 1
  # postgres://USER@HOST:PORT/DB (no password: the test server uses trust).
  [[ "${LEASEHOLD_TEST_POSTGRES:-}" =~ ^postgres(ql)?://([^@:/]+)@([^:/]+):([0-9]+)/([^?]+) ]] || {
    echo "pgbouncer: cannot read user, host, port and database from LEASEHOLD_TEST_POSTGRES" >&2
    return 1
  }
  user=${BASH_REMATCH[2]} host=${BASH_REMATCH[3]} pgport=${BASH_REMATCH[4]} db=${BASH_REMATCH[5]}
  port=$(leasehold_free_port) || return 1
  printf '"%s" ""\n' "$user" >"$dir/userlist.txt"
  cat >"$dir/pgbouncer.ini" <<EOF
[databases]
$db = host=$host port=$pgport dbname=$db user=$user
; Any other database name goes to the server's database of that name: tests
; create a database of their own to stay apart.
* = host=$host port=$pgport user=$user

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $dir/userlist.txt
pool_mode = transaction
ignore_startup_parameters = $ignore
default_pool_size = 4
max_client_conn = 500
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
EOF
  if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 && command -v runuser >/dev/null 2>&1 || return 1
    chown -R postgres: "$dir" || return 1
    runas="runuser -u postgres --"
  fi
  $runas "$bin" -d -q "$dir/pgbouncer.ini" >>"$dir/start.log" 2>&1 || {
    echo "pgbouncer: did not start, see $dir/start.log and $dir/pgbouncer.log" >&2
    return 1
  }
  LEASEHOLD_STOP_HOOKS+=("kill \$(cat '$dir/pgbouncer.pid' 2>/dev/null) 2>/dev/null; sleep 0.2; rm -rf '$dir'")
  local i
  for i in $(seq 1 50); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && {
      LEASEHOLD_PGBOUNCER_URL="postgres://$user@127.0.0.1:$port/$db"
      return 0
    }
    sleep 0.1
  done
  echo "pgbouncer: not accepting connections on port $port, see $dir/pgbouncer.log" >&2
  return 1
}

leasehold_start_pgbouncer() {
  local dir
  if [ -n "${LEASEHOLD_TEST_PGBOUNCER:-}" ]; then
    echo "pgbouncer: using LEASEHOLD_TEST_PGBOUNCER as set" >&2
    return 0
  fi
  if [ -z "${LEASEHOLD_TEST_POSTGRES:-}" ]; then
    echo "pgbouncer: no PostgreSQL to pool; PgBouncer tests will skip" >&2
    return 1
  fi
  leasehold_apt_install_in_ci pgbouncer pgbouncer leasehold_pgbouncer_bin || true
  if ! leasehold_pgbouncer_bin >/dev/null; then
    echo "pgbouncer: pgbouncer is not installed; PgBouncer tests will skip" >&2
    return 1
  fi
  dir=$(mktemp -d /tmp/leasehold-pgbouncer-XXXXXX) || return 1
  leasehold_pgbouncer_start "$dir" extra_float_digits,options || return 1
  export LEASEHOLD_TEST_PGBOUNCER=$LEASEHOLD_PGBOUNCER_URL
  echo "pgbouncer: using $LEASEHOLD_TEST_PGBOUNCER (transaction pooling)" >&2
  dir=$(mktemp -d /tmp/leasehold-pgbouncer-XXXXXX) || return 0
  leasehold_pgbouncer_start "$dir" "" || return 0
  export LEASEHOLD_TEST_PGBOUNCER_STRICT=$LEASEHOLD_PGBOUNCER_URL
}

LEASEHOLD_LATE_STARTS+=(leasehold_start_pgbouncer)
