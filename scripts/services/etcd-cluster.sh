# Sourced by scripts/test-services.sh: provides LEASEHOLD_TEST_ETCD_CLUSTER
# (an etcd:// URL naming the 3 members) and LEASEHOLD_ETCD_CLUSTER_DIR (what
# scripts/etcd-cluster.sh reads to find, kill, pause or restart the leader).
#
# Keeps a URL the caller set. Otherwise starts a private 3-member cluster on
# free loopback ports (etcd.sh, sourced before this file, installs the
# binaries and defines the helpers), with a stop hook for every member.

leasehold_start_etcd_cluster() {
  if [ -n "${LEASEHOLD_TEST_ETCD_CLUSTER:-}" ]; then
    echo "etcd-cluster: using LEASEHOLD_TEST_ETCD_CLUSTER=$LEASEHOLD_TEST_ETCD_CLUSTER" >&2
    return 0
  fi
  if ! declare -F leasehold_etcd_install >/dev/null || ! leasehold_etcd_install; then
    echo "etcd-cluster: etcd/etcdctl not available; cluster tests will skip" >&2
    return 0
  fi
  local ports dir i cluster="" url="" pid
  mapfile -t ports < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(6)]
for s in socks: s.bind(("127.0.0.1", 0))
for s in socks: print(s.getsockname()[1])' 2>/dev/null || true)
  dir="$(mktemp -d "${TMPDIR:-/tmp}/leasehold-etcd-cluster.XXXXXX" 2>/dev/null || true)"
  if [ "${#ports[@]}" -ne 6 ] || [ -z "$dir" ]; then
    echo "etcd-cluster: no free ports or temp dir; cluster tests will skip" >&2
    return 0
  fi
  for i in 0 1 2; do
    cluster="${cluster:+$cluster,}m$i=http://127.0.0.1:${ports[$((i + 3))]}"
    url="${url:+$url,}127.0.0.1:${ports[$i]}"
  done
  for i in 0 1 2; do
    pid="$(leasehold_etcd_member "$dir" "m$i" "${ports[$i]}" "${ports[$((i + 3))]}" "$cluster")"
    echo "$pid" >"$dir/m$i.pid"
    echo "${ports[$i]}" >"$dir/m$i.port"
  done
  # Stops whatever pid each member has now (a test may have restarted it).
  LEASEHOLD_STOP_HOOKS+=("for f in $dir/m*.pid; do leasehold_etcd_stop \"\$(cat \"\$f\")\"; done; rm -rf '$dir'")
  for i in 0 1 2; do
    if ! leasehold_etcd_wait "${ports[$i]}"; then
      echo "etcd-cluster: member m$i did not join; log follows; cluster tests will skip" >&2
      tail -n 20 "$dir/m$i/etcd.log" >&2 || true
      return 0
    fi
  done
  export LEASEHOLD_ETCD_CLUSTER_DIR="$dir"
  export LEASEHOLD_TEST_ETCD_CLUSTER="etcd://$url"
  echo "etcd-cluster: 3 members at $LEASEHOLD_TEST_ETCD_CLUSTER" >&2
}

# After every script is sourced: the helpers live in etcd.sh, sourced later.
LEASEHOLD_LATE_STARTS+=(leasehold_start_etcd_cluster)
