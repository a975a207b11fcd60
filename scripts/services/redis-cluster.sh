# Redis Cluster for the tests: sourced by scripts/test-services.sh, exports
# LEASEHOLD_TEST_REDIS_CLUSTER (a redis+cluster:// URL naming every node).
# Keeps a URL the caller set; else starts a private, throwaway cluster of 3
# primaries and 3 replicas (Debian's redis-server, no persistence) in a temp
# dir, on client and cluster-bus ports chosen free at run time. A cluster it
# cannot start is reported and left unset: the suites skip unless
# LEASEHOLD_REQUIRE_SERVERS=1. Its stop hooks call leasehold_redis_stop from
# redis.sh, which is sourced by the time the hooks run.

LEASEHOLD_REDIS_CLUSTER_NODES=6

# $1 distinct free TCP ports on 127.0.0.1, one a line. All sockets are bound
# at once, so no two answers are the same port.
leasehold_free_ports() {
  python3 -c '
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
for s in socks:
    print(s.getsockname()[1])
' "$1"
}

# Whether every node on the ports given reports cluster_state:ok.
leasehold_redis_cluster_ok() {
  local port
  for port in "$@"; do
    timeout 3 redis-cli -h 127.0.0.1 -p "$port" cluster info 2>/dev/null \
      | grep -q '^cluster_state:ok' || return 1
  done
}

leasehold_redis_cluster_service() {
  local dir ports port bus node pid i url=""
  if [ -n "${LEASEHOLD_TEST_REDIS_CLUSTER:-}" ]; then
    echo "redis-cluster: using LEASEHOLD_TEST_REDIS_CLUSTER=$LEASEHOLD_TEST_REDIS_CLUSTER"
    return 0
  fi
  if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    echo "redis-cluster: redis-server or redis-cli is not installed (apt-get install redis-server); cluster tests will skip" >&2
    return 0
  fi
  # Each node needs a client port and a cluster-bus port.
  mapfile -t ports < <(leasehold_free_ports $((2 * LEASEHOLD_REDIS_CLUSTER_NODES)) 2>/dev/null || true)
  dir="$(mktemp -d "${TMPDIR:-/tmp}/leasehold-redis-cluster.XXXXXX" 2>/dev/null || true)"
  if [ "${#ports[@]}" -ne $((2 * LEASEHOLD_REDIS_CLUSTER_NODES)) ] || [ -z "$dir" ]; then
    echo "redis-cluster: no free ports or temp dir; cluster tests will skip" >&2
    return 0
  fi
  for i in $(seq 0 $((LEASEHOLD_REDIS_CLUSTER_NODES - 1))); do
    port="${ports[$i]}"
    bus="${ports[$((i + LEASEHOLD_REDIS_CLUSTER_NODES))]}"
    node="$dir/$port"
    mkdir -p "$node"
    if ! redis-server --port "$port" --bind 127.0.0.1 --daemonize yes \
        --cluster-enabled yes --cluster-port "$bus" \
        --cluster-config-file "$node/nodes.conf" --cluster-node-timeout 2000 \
        --save "" --appendonly no --dir "$node" \
        --pidfile "$node/redis.pid" --logfile "$node/redis.log" >/dev/null 2>&1; then
      echo "redis-cluster: redis-server failed to start on port $port; cluster tests will skip" >&2
      break
    fi
    url="${url:+$url,}127.0.0.1:$port"
  done
  # Stop hooks for every node that wrote a pid file, whatever happens next.
  for i in $(seq 0 $((LEASEHOLD_REDIS_CLUSTER_NODES - 1))); do
    for _ in $(seq 50); do
      [ -s "$dir/${ports[$i]}/redis.pid" ] && break
      sleep 0.1
    done
    pid="$(cat "$dir/${ports[$i]}/redis.pid" 2>/dev/null || true)"
    if [ -n "$pid" ]; then
      LEASEHOLD_STOP_HOOKS+=("leasehold_redis_stop $pid $dir/${ports[$i]}")
    fi
  done
  LEASEHOLD_STOP_HOOKS+=("rm -rf $dir")
  for port in "${ports[@]:0:$LEASEHOLD_REDIS_CLUSTER_NODES}"; do
    for _ in $(seq 100); do
      [ "$(timeout 3 redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null)" = PONG ] && break
      sleep 0.1
    done
  done
  if ! timeout 60 redis-cli --cluster create \
      $(printf '127.0.0.1:%s ' "${ports[@]:0:$LEASEHOLD_REDIS_CLUSTER_NODES}") \
      --cluster-replicas 1 --cluster-yes >"$dir/create.log" 2>&1; then
    echo "redis-cluster: redis-cli --cluster create failed (see below); cluster tests will skip" >&2
    tail -n 20 "$dir/create.log" >&2 || true
    return 0
  fi
  for _ in $(seq 300); do
    leasehold_redis_cluster_ok "${ports[@]:0:$LEASEHOLD_REDIS_CLUSTER_NODES}" && break
    sleep 0.1
  done
  if leasehold_redis_cluster_ok "${ports[@]:0:$LEASEHOLD_REDIS_CLUSTER_NODES}"; then
    export LEASEHOLD_TEST_REDIS_CLUSTER="redis+cluster://$url"
    echo "redis-cluster: started 3 primaries + 3 replicas: $LEASEHOLD_TEST_REDIS_CLUSTER"
  else
    echo "redis-cluster: the cluster did not reach cluster_state:ok; cluster tests will skip" >&2
  fi
}

leasehold_redis_cluster_service
