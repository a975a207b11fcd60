#!/usr/bin/env bash
# Faults on the 3-member test cluster started by services/etcd-cluster.sh
# (its directory in LEASEHOLD_ETCD_CLUSTER_DIR):
#   scripts/etcd-cluster.sh leader         prints the leader's member name (m0..m2)
#   scripts/etcd-cluster.sh kill-leader    SIGKILLs the leader, waits for a new
#                                          one, restarts the old member
#   scripts/etcd-cluster.sh pause-leader [SECONDS]
#                                          SIGSTOPs the leader for SECONDS
#                                          (default 2), then SIGCONTs it
#   scripts/etcd-cluster.sh partition-member [SECONDS]
#                                          cuts one member off from the
#                                          other two for SECONDS (default 3),
#                                          then heals and waits for it to
#                                          rejoin (below)
#   scripts/etcd-cluster.sh heal           deletes the partition, if any
# Used as `leasehold torture --restart-cmd` and by the failover tests.
set -euo pipefail
dir="${LEASEHOLD_ETCD_CLUSTER_DIR:?start the cluster with scripts/test-services.sh}"

# endpoints [EXCEPT]: every member's client URL, or all but member EXCEPT.
endpoints() {
  local f out=""
  for f in "$dir"/m*.port; do
    [ "${1:-}" = "$(basename "$f" .port)" ] && continue
    out="${out:+$out,}http://127.0.0.1:$(cat "$f")"
  done
  echo "$out"
}

# leader [EXCEPT]: the leader's name, from any member that answers (but
# EXCEPT: a member cut off may still believe it leads).
leader() {
  ETCDCTL_API=3 etcdctl --endpoints "$(endpoints "${1:-}")" --command-timeout=2s \
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

# The partition's nft table (named when the cluster was started by
# leasehold_start_etcd_partition_cluster, scripts/services/etcd-cluster.sh).
table() {
  if [ ! -f "$dir/nft-table" ]; then
    echo "etcd-cluster: $dir has no nft-table: start it with leasehold_start_etcd_partition_cluster" >&2
    return 1
  fi
  cat "$dir/nft-table"
}

heal() {
  local t
  t="$(table)"
  nft delete table inet "$t" 2>/dev/null || true
}

# The member a current holder talks to alone, from the hosts torture hands
# over ($LEASEHOLD_TORTURE_HOLDER_HOSTS: one entry per holder, its URL's
# hosts; a worker pinned by --pin-hosts names one). Empty if none.
pinned_holder_member() {
  local entry f
  for entry in ${LEASEHOLD_TORTURE_HOLDER_HOSTS:-}; do
    case "$entry" in *,*) continue ;; esac
    for f in "$dir"/m*.port; do
      if [ "${entry##*:}" = "$(cat "$f")" ]; then
        basename "$f" .port
        return 0
      fi
    done
  done
}

# partition_member SECONDS: cuts one member off from the other two, peer
# traffic only: its client port stays open, so a client that names only
# that member still reaches it, and is answered Unavailable (no leader)
# instead of being granted anything. The member is the one a current lease
# holder is pinned to, else the leader. Every member runs as its own uid
# (the partition cluster), and one nft table on the output hook (every
# loopback packet passes it once) drops
#   - anything to the member's peer port, and its answers from that port;
#   - what the member's uid sends to any peer port (the connections it
#     dials: rafthttp's streams are dialed by the receiver, its pipeline
#     POSTs by the sender), and, by a conntrack mark set on those
#     connections, the other members' packets on them.
# The mark is new for each partition, so a connection marked during an
# earlier one (and reused after healing) is not cut by this one. Exits 0 if
# the member cut off was a holder's, 3 if no holder was pinned to one (the
# leader was cut off instead: the nemesis counts that as a miss).
partition_member() {
  local seconds=$1 t name aimed=0 uid peer ports mark before during back began cut healed
  began=$(date +%s%N)
  t="$(table)"
  name="$(pinned_holder_member)"
  if [ -n "$name" ]; then
    aimed=1
  else
    name="$(wait_for_leader)"
  fi
  uid="$(cat "$dir/$name.uid")"
  peer="$(cat "$dir/$name.peer")"
  ports="$(cat "$dir"/m*.peer | paste -sd, -)"
  mark=$(( (RANDOM << 15 | RANDOM) | 1 ))
  # Who leads just before the cut (etcdctl takes a while to start on a
  # loaded machine: asked after the cut, the others may have elected a
  # new leader already).
  before="$(leader || true)"
  trap 'nft delete table inet "$t" 2>/dev/null || true' EXIT
  trap 'exit 130' INT TERM
  nft -f - <<NFT
table inet $t {
  chain out {
    type filter hook output priority 0; policy accept;
    tcp dport $peer drop
    tcp sport $peer drop
    meta skuid $uid tcp dport { $ports } ct mark set $mark drop
    ct mark $mark drop
  }
}
NFT
  cut=$(date +%s%N)
  sleep "$seconds"
  during="$(leader "$name" || true)"
  nft delete table inet "$t"
  trap - EXIT
  healed=$(date +%s%N)
  # Rejoined: the member answers a linearizable read again (it has a
  # leader and has caught up with it).
  back=no
  for _ in $(seq 100); do
    if ETCDCTL_API=3 etcdctl --endpoints "http://127.0.0.1:$(cat "$dir/$name.port")" \
        --command-timeout=1s get leasehold-probe >/dev/null 2>&1; then
      back=yes
      break
    fi
    sleep 0.1
  done
  # One line (torture keeps the last line of the output in the fault's
  # detail); times in ms from the command's start.
  echo "partitioned $name (${before:-?} led just before the cut, ${during:-nobody} led the other two at the end)" \
    "from +$(((cut - began) / 1000000)) to +$(((healed - began) / 1000000)) ms;" \
    "back with a leader: $back, $((($(date +%s%N) - healed) / 1000000)) ms after healing;" \
    "$([ "$aimed" = 1 ] && echo "a holder was pinned to it" || echo "no holder was pinned to a member: cut off the leader")"
  [ "$back" = yes ] || return 1
  [ "$aimed" = 1 ] || return 3
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
  partition-member)
    partition_member "${2:-3}"
    ;;
  heal)
    heal
    ;;
  *)
    echo "usage: $0 leader|kill-leader|pause-leader [SECONDS]|partition-member [SECONDS]|heal" >&2
    exit 64
    ;;
esac
