#!/usr/bin/env bash
# Fails over the Redis Cluster primary that owns a torture run's lock, as
# the restart step of `leasehold torture`:
#
#   leasehold --store 'redis+cluster://H:P,...' torture --faults kill,pause,restart \
#     --restart-cmd 'scripts/redis-cluster-failover.sh H:P [takeover|graceful]'
#
# The lock is the first key in $LEASEHOLD_TORTURE_KEYS (torture sets it for
# the command). leasehold's hash tag of a lock key is the key itself
# (percent-encoding only `%`, `{`, `}`, which torture keys never hold), so
# the lock's slot is `CLUSTER KEYSLOT KEY`.
#
# MODE
#   takeover (default) the primary freezes (SIGSTOP, a long GC-like pause),
#            its replica takes the slots without the primary's agreement
#            (CLUSTER FAILOVER TAKEOVER), then the old primary resumes. Until
#            it hears of the new epoch it still serves, as a primary, the
#            commands clients queued to it; its writes in that window reach
#            no replica and are dropped when it rejoins as one. This is the
#            window `min_replicas` (WAIT) is there to close.
#   lagging  as takeover, but first the replica falls behind: the primary's
#            output limit for replicas drops to 1 byte, so it cuts the
#            replica off at its next write and every reconnect, for 300 ms
#            of traffic. Grants made then exist on the primary only when it
#            is replaced: replication lag at the moment of a failover, made
#            certain instead of left to chance. The limit is restored after.
#   graceful CLUSTER FAILOVER on the replica: it catches up with the primary
#            before switching, so nothing acknowledged is lost.
#
# Returns once the old primary is a replica in sync with the new one and
# every node reports cluster_state:ok; exits non-zero (the fault then
# counts as not hit) if any step does not happen within its limit.
set -euo pipefail
trap 'echo "redis-cluster-failover: line $LINENO failed: $BASH_COMMAND" >&2' ERR
seed=${1:?usage: redis-cluster-failover.sh HOST:PORT [takeover|lagging|graceful]}
mode=${2:-takeover}
key=${LEASEHOLD_TORTURE_KEYS:-}
key=${key%% *}
if [ -z "$key" ]; then
  echo "redis-cluster-failover: LEASEHOLD_TORTURE_KEYS is not set (run me as torture's --restart-cmd)" >&2
  exit 64
fi
case "$mode" in takeover | lagging | graceful) ;; *)
  echo "redis-cluster-failover: mode must be takeover, lagging or graceful, got $mode" >&2
  exit 64
  ;;
esac

# redis-cli on HOST:PORT.
cli() {
  local addr=$1
  shift
  timeout 5 redis-cli -h "${addr%:*}" -p "${addr##*:}" "$@"
}

# Polls "$@" every 50 ms for up to $1 seconds.
within() {
  local seconds=$1 i
  shift
  for i in $(seq $((seconds * 20))); do
    "$@" 2>/dev/null && return 0
    sleep 0.05
  done
  return 1
}

role_is() { [ "$(cli "$1" role | head -n 1)" = "$2" ]; }
in_sync() { cli "$1" info replication | tr -d '\r' | grep -q '^master_link_status:up'; }
# Every node reports cluster_state:ok and sees the old primary as a replica
# (gossip reaches the nodes one by one; the next failover reads a node's view).
all_ok() {
  local addr
  for addr in $nodes_addrs; do
    cli "$addr" cluster info | tr -d '\r' | grep -q '^cluster_state:ok' || return 1
    cli "$addr" cluster nodes | grep -q "^$primary_id [^ ]* [a-z,]*slave " || return 1
  done
}

slot=$(cli "$seed" cluster keyslot "$key")
# Addresses as HOST:PORT (without `@BUSPORT[,HOSTNAME]`).
nodes=$(cli "$seed" cluster nodes | awk '{ sub(/@.*/, "", $2); print }')
nodes_addrs=$(awk '{print $2}' <<<"$nodes")
# The primary whose ranges (`a-b` or `a`; `[...]` marks a migration) hold the slot.
read -r primary_id primary < <(awk -v s="$slot" '$3 ~ /master/ && $3 !~ /fail/ {
  for (i = 9; i <= NF; i++) {
    if ($i ~ /^\[/) continue
    n = split($i, r, "-"); lo = r[1] + 0; hi = (n == 2 ? r[2] : r[1]) + 0
    if (s >= lo && s <= hi) { print $1, $2; exit }
  }
}' <<<"$nodes") || true
replica=$(awk -v m="$primary_id" '$4 == m && $3 ~ /slave/ && $3 !~ /fail/ { print $2; exit }' <<<"$nodes")
if [ -z "${primary:-}" ] || [ -z "$replica" ]; then
  echo "redis-cluster-failover: slot $slot of $key has no primary with a healthy replica" >&2
  exit 1
fi

if [ "$mode" != graceful ]; then
  pid=$(cli "$primary" info server | tr -d '\r' | awk -F: '/^process_id:/ {print $2}')
  if [ "$mode" = lagging ]; then
    limit=$(cli "$primary" config get client-output-buffer-limit | tail -n 1)
    trap 'cli "$primary" config set client-output-buffer-limit "$limit" >/dev/null || true' EXIT
    cli "$primary" config set client-output-buffer-limit "replica 1 1 0" >/dev/null
    sleep 0.3
  fi
  kill -STOP "$pid"
  trap 'kill -CONT "$pid" 2>/dev/null || true
    [ -z "${limit:-}" ] || cli "$primary" config set client-output-buffer-limit "$limit" >/dev/null || true' EXIT
  cli "$replica" cluster failover takeover >/dev/null
  within 10 role_is "$replica" master
  # Clients whose slot map still names the frozen primary queue commands
  # to it meanwhile.
  sleep 0.3
  kill -CONT "$pid"
  if [ "$mode" = lagging ]; then
    cli "$primary" config set client-output-buffer-limit "$limit" >/dev/null
  fi
else
  cli "$replica" cluster failover >/dev/null
  within 10 role_is "$replica" master
fi
within 20 role_is "$primary" slave
within 20 in_sync "$primary"
within 20 all_ok
echo "slot $slot ($key): $primary -> $replica ($mode)"
