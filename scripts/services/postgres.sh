# PostgreSQL for the tests: sourced by scripts/test-services.sh.
#
# Exports LEASEHOLD_TEST_POSTGRES, in this order of preference:
#   1. as already set by the caller;
#   2. a server answering on 127.0.0.1:5432 with trust auth (database `test`,
#      created if missing);
#   3. the Debian package's cluster, started with pg_ctlcluster, if it then
#      accepts user postgres without a password;
#   4. a private throw-away cluster (initdb + pg_ctl) on a free port, stopped
#      and deleted by leasehold_stop_services;
# otherwise prints a notice and leaves it unset (the tests then skip, or fail
# under LEASEHOLD_REQUIRE_SERVERS=1). In CI (CI=true, root, apt-get) without
# any PostgreSQL binaries it installs the `postgresql` package first.
#
# Everything runs inside functions called as `f || true`, so a failing probe
# never aborts a caller running under `set -euo pipefail`.

# The directory with initdb and pg_ctl (newest version), if any.
leasehold_pg_bindir() {
  local dir
  if command -v pg_ctl >/dev/null 2>&1 && command -v initdb >/dev/null 2>&1; then
    dirname "$(command -v pg_ctl)"
    return 0
  fi
  dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  if [ -n "$dir" ] && [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then
    echo "$dir"
    return 0
  fi
  return 1
}

# Whether something accepts PostgreSQL connections on HOST PORT.
leasehold_pg_ready() {
  local bindir
  if command -v pg_isready >/dev/null 2>&1; then
    pg_isready -q -h "$1" -p "$2" -t 3
    return $?
  fi
  if bindir=$(leasehold_pg_bindir) && [ -x "$bindir/pg_isready" ]; then
    "$bindir/pg_isready" -q -h "$1" -p "$2" -t 3
    return $?
  fi
  (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null
}

# psql on HOST PORT as user postgres, never prompting for a password.
leasehold_pg_psql() {
  local host=$1 port=$2 psql=psql bindir
  shift 2
  if ! command -v psql >/dev/null 2>&1; then
    bindir=$(leasehold_pg_bindir) || return 1
    psql="$bindir/psql"
  fi
  PGCONNECT_TIMEOUT=5 "$psql" -w -X -q -h "$host" -p "$port" -U postgres "$@"
}

# Exports the URL of database `test` on HOST PORT, creating it if needed;
# fails if user postgres cannot log in without a password.
leasehold_pg_use() {
  local host=$1 port=$2 exists
  exists=$(leasehold_pg_psql "$host" "$port" -d postgres -tAc \
    "SELECT 1 FROM pg_database WHERE datname = 'test'" 2>/dev/null) || return 1
  if [ "$exists" != "1" ]; then
    leasehold_pg_psql "$host" "$port" -d postgres -c 'CREATE DATABASE test' >/dev/null 2>&1 ||
      return 1
  fi
  export LEASEHOLD_TEST_POSTGRES="postgres://postgres@$host:$port/test"
  echo "postgres: using $LEASEHOLD_TEST_POSTGRES" >&2
}

# The Debian package's cluster (`pg_ctlcluster VERSION main start`).
leasehold_pg_debian_cluster() {
  local version
  command -v pg_ctlcluster >/dev/null 2>&1 || return 1
  version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)
  [ -n "$version" ] && [ -d "/etc/postgresql/$version/main" ] || return 1
  pg_ctlcluster --skip-systemctl-redirect "$version" main start >/dev/null 2>&1 || true
  leasehold_pg_ready 127.0.0.1 5432 && leasehold_pg_use 127.0.0.1 5432
}

# A private cluster in a temp dir on a free port, run as user postgres when
# we are root (initdb refuses root).
leasehold_pg_private_cluster() {
  local bindir dir port runas=""
  bindir=$(leasehold_pg_bindir) || return 1
  dir=$(mktemp -d /tmp/leasehold-pg-XXXXXX) || return 1
  if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 && command -v runuser >/dev/null 2>&1 || {
      rm -rf "$dir"
      return 1
    }
    chown postgres: "$dir" || return 1
    runas="runuser -u postgres --"
  fi
  port=$(leasehold_free_port) || return 1
  $runas "$bindir/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --no-sync \
    >"$dir/initdb.log" 2>&1 || {
    echo "postgres: initdb failed, see $dir/initdb.log" >&2
    return 1
  }
  LEASEHOLD_STOP_HOOKS+=("$runas '$bindir/pg_ctl' -D '$dir/data' -m fast -w stop >/dev/null 2>&1; rm -rf '$dir'")
  $runas "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
    -o "-p $port -c listen_addresses=127.0.0.1 -c unix_socket_directories=''" \
    start >/dev/null 2>&1 || {
    echo "postgres: private cluster did not start, see $dir/server.log" >&2
    return 1
  }
  leasehold_pg_use 127.0.0.1 "$port"
}

leasehold_start_postgres() {
  if [ -n "${LEASEHOLD_TEST_POSTGRES:-}" ]; then
    echo "postgres: using LEASEHOLD_TEST_POSTGRES as set" >&2
    return 0
  fi
  leasehold_apt_install_in_ci postgres postgresql leasehold_pg_bindir || true
  if leasehold_pg_ready 127.0.0.1 5432 && leasehold_pg_use 127.0.0.1 5432; then
    return 0
  fi
  leasehold_pg_debian_cluster && return 0
  leasehold_pg_private_cluster && return 0
  echo "postgres: no server found or started; PostgreSQL tests will skip" >&2
  return 1
}

leasehold_start_postgres || true
