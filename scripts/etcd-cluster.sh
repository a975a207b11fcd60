#!/usr/bin/env bash
# Faults on the 3-member test cluster started by services/etcd-cluster.sh
# (its directory in LEASEHOLD_ETCD_CLUSTER_DIR):
#   scripts/etcd-cluster.sh leader         prints the leader's member name (m0..m2)
#   scripts/etcd-cluster.sh kill-leader    SIGKILLs the leader, waits for a new
#                                          one, restarts the old member
#   scripts/etcd-cluster.sh pause-leader [SECONDS]
#                                          SIGSTOPs the leader for SECONDS
#                                          (default 2), then SIGCONTs it
# Used as `leasehold torture --restart-cmd` and by the failover tests.
set -euo pipefail
dir="${LEASEHOLD_ETCD_CLUSTER_DIR:?start the cluster with scripts/test-services.sh}"

endpoints() {
  local f out=""
  for f in "$dir"/m*.port; do
    out="${out:+$out,}http://127.0.0.1:$(cat "$f")"
  done
  echo "$out"
}

# The leader's name, from any member that answers.
leader() {
  ETCDCTL_API=3 etcdctl --endpoints "$(endpoints)" --command-timeout=2s \
    endpoint status -w json 2>/dev/null | python3 -c '
import json, sys
for s in json.load(sys.stdin):
    st = s["Status"]
    if st["header"]["member_id"] == st["leader"]:
        port = s["Endpoint"].rsplit(":", 1)[1]
        print(port)
        break
' | while read -r port; do
    grep -l "^$port\$" "$dir"/m*.port | sed 's#.*/\(m[0-9]\)\.port#\1#'
  done
}

wait_for_leader() {
  local _ name
  for _ in $(seq 100); do
    name="$(leader || true)"
    if [ -n "$name" ]; then
      echo "$name"
      return 0
    fi
    sleep 0.1
  done
  echo "etcd-cluster: no leader within 10 s" >&2
  return 1
}

case "${1:-}" in
  leader)
    wait_for_leader
    ;;
  kill-leader)
    name="$(wait_for_leader)"
    pid="$(cat "$dir/$name.pid")"
    kill -KILL "$pid" 2>/dev/null || true
    # A new leader among the other two, then the old member back as a
    # follower (its data dir is kept: it rejoins with its log, and etcd
    # ignores the --initial-cluster flags of a bootstrapped member).
    sleep 0.2
    wait_for_leader >/dev/null
    bash "$dir/$name.cmd" &
    echo $! >"$dir/$name.pid"
    echo "killed leader $name (pid $pid), restarted it as pid $(cat "$dir/$name.pid")"
    ;;
  pause-leader)
    name="$(wait_for_leader)"
    pid="$(cat "$dir/$name.pid")"
    kill -STOP "$pid"
    sleep "${2:-2}"
    kill -CONT "$pid"
    echo "paused leader $name (pid $pid) for ${2:-2} s"
    ;;
  *)
    echo "usage: $0 leader|kill-leader|pause-leader [SECONDS]" >&2
    exit 64
    ;;
esac
