# Sourced by scripts/test-services.sh: provides LEASEHOLD_TEST_ETCD_CLUSTER
# (an etcd:// URL naming the 3 members) and LEASEHOLD_ETCD_CLUSTER_DIR (what
# scripts/etcd-cluster.sh reads to find, kill, pause or restart the leader).
#
# Keeps a URL the caller set. Otherwise starts a private 3-member cluster on
# free loopback ports (etcd.sh, sourced before this file, installs the
# binaries and defines the helpers), with a stop hook for every member.
#
# Also defines leasehold_start_etcd_partition_cluster, which scripts/torture.sh
# calls for its partition runs: another private 3-member cluster, each
# member under its own uid, so that scripts/etcd-cluster.sh partition-member
# can cut one off with nftables.

# leasehold_etcd_cluster_up DIR [UID_BASE]: starts 3 members in DIR on free
# loopback ports (DIR/m$i.pid, .port: client port, .peer: peer port, .uid),
# member i as uid UID_BASE+i if given, registers their stop hook (which
# also removes DIR) and waits for them. Prints the etcd:// URL; says why
# and returns 1 if it could not.
leasehold_etcd_cluster_up() {
  local dir=$1 uid_base=${2:-} ports i cluster="" url="" pid uid
  mapfile -t ports < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(6)]
for s in socks: s.bind(("127.0.0.1", 0))
for s in socks: print(s.getsockname()[1])' 2>/dev/null || true)
  if [ "${#ports[@]}" -ne 6 ]; then
    echo "etcd-cluster: no free ports" >&2
    return 1
  fi
  for i in 0 1 2; do
    cluster="${cluster:+$cluster,}m$i=http://127.0.0.1:${ports[$((i + 3))]}"
    url="${url:+$url,}127.0.0.1:${ports[$i]}"
  done
  for i in 0 1 2; do
    uid=""
    [ -n "$uid_base" ] && uid=$((uid_base + i))
    pid="$(leasehold_etcd_member "$dir" "m$i" "${ports[$i]}" "${ports[$((i + 3))]}" "$cluster" "$uid")"
    echo "$pid" >"$dir/m$i.pid"
    echo "${ports[$i]}" >"$dir/m$i.port"
    echo "${ports[$((i + 3))]}" >"$dir/m$i.peer"
    [ -n "$uid" ] && echo "$uid" >"$dir/m$i.uid"
  done
  # Stops whatever pid each member has now (a test may have restarted it).
  LEASEHOLD_STOP_HOOKS+=("for f in $dir/m*.pid; do leasehold_etcd_stop \"\$(cat \"\$f\")\"; done; rm -rf '$dir'")
  for i in 0 1 2; do
    if ! leasehold_etcd_wait "${ports[$i]}"; then
      echo "etcd-cluster: member m$i did not join; log follows" >&2
      tail -n 20 "$dir/m$i/etcd.log" >&2 || true
      return 1
    fi
  done
  echo "etcd://$url"
}

# leasehold_etcd_private_cluster NAME DIR_VAR URL_VAR [UID_BASE]: the shared
# and the partition cluster alike: 3 members (leasehold_etcd_cluster_up, uids
# from UID_BASE if given) in a new directory leasehold-etcd-NAME.* under
# TMPDIR; exports DIR_VAR (that directory) and URL_VAR (the etcd:// URL).
# Says why, as etcd-NAME, and returns 1 if it could not start them.
leasehold_etcd_private_cluster() {
  local name=$1 dir_var=$2 url_var=$3 uid_base=${4:-} dir
  dir="$(mktemp -d "${TMPDIR:-/tmp}/leasehold-etcd-$name.XXXXXX" 2>/dev/null || true)"
  if [ -z "$dir" ]; then
    echo "etcd-$name: no temp dir" >&2
    return 1
  fi
  # Not in a command substitution: the stop hook must reach this shell.
  if ! leasehold_etcd_cluster_up "$dir" "$uid_base" >"$dir/url"; then
    echo "etcd-$name: the cluster did not start" >&2
    return 1
  fi
  export "$dir_var=$dir" "$url_var=$(cat "$dir/url")"
  echo "etcd-$name: 3 members at ${!url_var}${uid_base:+, uids $uid_base-$((uid_base + 2))}" >&2
}

leasehold_start_etcd_cluster() {
  if [ -n "${LEASEHOLD_TEST_ETCD_CLUSTER:-}" ]; then
    echo "etcd-cluster: using LEASEHOLD_TEST_ETCD_CLUSTER=$LEASEHOLD_TEST_ETCD_CLUSTER" >&2
    return 0
  fi
  if ! declare -F leasehold_etcd_install >/dev/null || ! leasehold_etcd_install; then
    echo "etcd-cluster: etcd/etcdctl not available; cluster tests will skip" >&2
    return 0
  fi
  if ! leasehold_etcd_private_cluster cluster LEASEHOLD_ETCD_CLUSTER_DIR LEASEHOLD_TEST_ETCD_CLUSTER; then
    echo "etcd-cluster: cluster tests will skip" >&2
  fi
}

# Why a partition cannot be made here (empty if it can): it needs root,
# setpriv (util-linux) and a working nft (nftables).
leasehold_etcd_partition_unavailable() {
  local probe="leasehold_probe_$$"
  if [ "$(id -u)" != 0 ]; then
    echo "not root (members run under their own uids, nft needs root)"
  elif ! command -v setpriv >/dev/null 2>&1; then
    echo "no setpriv (util-linux)"
  elif ! command -v nft >/dev/null 2>&1; then
    echo "no nft (apt-get install nftables)"
  elif ! nft add table inet "$probe" 2>/dev/null; then
    echo "nft cannot add a table here"
  else
    nft delete table inet "$probe" 2>/dev/null || true
    if ! declare -F leasehold_etcd_install >/dev/null || ! leasehold_etcd_install; then
      echo "etcd/etcdctl not available"
    fi
  fi
}

# Starts the partition cluster: exports LEASEHOLD_ETCD_PARTITION_CLUSTER
# (its etcd:// URL) and LEASEHOLD_ETCD_PARTITION_DIR, or, where a partition
# cannot be made, prints why and leaves them unset. Never the shared
# cluster: its members run as root, and other tests use it.
leasehold_start_etcd_partition_cluster() {
  local why base table
  why="$(leasehold_etcd_partition_unavailable)"
  if [ -n "$why" ]; then
    echo "etcd-partition: $why" >&2
    return 0
  fi
  # Three uids no account uses, from a random base.
  for _ in $(seq 20); do
    base=$((40000 + RANDOM % 20000))
    if ! getent passwd "$base" "$((base + 1))" "$((base + 2))" >/dev/null 2>&1; then
      break
    fi
  done
  leasehold_etcd_private_cluster partition LEASEHOLD_ETCD_PARTITION_DIR LEASEHOLD_ETCD_PARTITION_CLUSTER "$base" ||
    return 0
  # The nft table partition-member adds, named after the directory: deleted
  # with the cluster, whatever stopped the run.
  table="leasehold_partition_$(basename "$LEASEHOLD_ETCD_PARTITION_DIR" | sed 's/.*\.//; s/[^A-Za-z0-9]/_/g')"
  echo "$table" >"$LEASEHOLD_ETCD_PARTITION_DIR/nft-table"
  LEASEHOLD_STOP_HOOKS+=("nft delete table inet $table 2>/dev/null || true")
}

# After every script is sourced: the helpers live in etcd.sh, sourced later.
LEASEHOLD_LATE_STARTS+=(leasehold_start_etcd_cluster)
