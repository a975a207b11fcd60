# Redis for the tests: sourced by scripts/test-services.sh, exports
# LEASEHOLD_TEST_REDIS. Order: keep a URL the caller set; else use a server
# answering on 127.0.0.1:6379; else start a private, throwaway redis-server
# on a free port (no persistence: the suites that need AOF start their own).
# Every probe is guarded, so a caller's `set -euo pipefail` survives a
# missing binary or a server that does not answer.

# Whether a Redis server answers PING on 127.0.0.1:$1.
leasehold_redis_answers() {
  local reply=""
  if command -v redis-cli >/dev/null 2>&1; then
    reply="$(timeout 3 redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null || true)"
  else
    # No redis-cli: speak RESP over bash's /dev/tcp ("+PONG\r\n").
    reply="$(timeout 3 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$0" && printf "PING\r\n" >&3 && head -c 5 <&3' "$1" 2>/dev/null | tr -d '+' || true)"
  fi
  [ "$reply" = "PONG" ]
}

# Stops a private server: SIGTERM, then SIGKILL after 5 s. A reaped-late
# daemon may linger as a zombie here, which counts as stopped.
leasehold_redis_stop() {
  local pid="$1" dir="$2" state i
  kill "$pid" 2>/dev/null || true
  for i in $(seq 50); do
    state="$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null || echo gone)"
    if [ "$state" = "gone" ] || [ "$state" = "Z" ]; then
      break
    fi
    [ "$i" = 50 ] && kill -9 "$pid" 2>/dev/null || true
    sleep 0.1
  done
  rm -rf "$dir"
}

leasehold_redis_service() {
  local port dir pid i
  if [ -n "${LEASEHOLD_TEST_REDIS:-}" ]; then
    echo "redis: using LEASEHOLD_TEST_REDIS=$LEASEHOLD_TEST_REDIS"
    return 0
  fi
  if leasehold_redis_answers 6379; then
    export LEASEHOLD_TEST_REDIS="redis://127.0.0.1:6379"
    echo "redis: using the server on 127.0.0.1:6379"
    return 0
  fi
  if ! command -v redis-server >/dev/null 2>&1; then
    echo "redis: no server on 127.0.0.1:6379 and redis-server is not installed; Redis tests will skip" >&2
    return 0
  fi
  port="$(leasehold_free_port 2>/dev/null || true)"
  dir="$(mktemp -d "${TMPDIR:-/tmp}/leasehold-redis.XXXXXX" 2>/dev/null || true)"
  if [ -z "$port" ] || [ -z "$dir" ]; then
    echo "redis: no free port or temp dir for a private redis-server; Redis tests will skip" >&2
    return 0
  fi
  if ! redis-server --port "$port" --bind 127.0.0.1 --daemonize yes \
      --save "" --appendonly no --dir "$dir" \
      --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" >/dev/null 2>&1; then
    echo "redis: redis-server failed to start; Redis tests will skip" >&2
    rm -rf "$dir"
    return 0
  fi
  for i in $(seq 100); do
    leasehold_redis_answers "$port" && break
    sleep 0.1
  done
  pid="$(cat "$dir/redis.pid" 2>/dev/null || true)"
  if [ -n "$pid" ]; then
    LEASEHOLD_STOP_HOOKS+=("leasehold_redis_stop $pid $dir")
  fi
  if leasehold_redis_answers "$port"; then
    export LEASEHOLD_TEST_REDIS="redis://127.0.0.1:$port"
    echo "redis: started a private redis-server on 127.0.0.1:$port"
  else
    echo "redis: private redis-server on port $port did not answer; Redis tests will skip" >&2
  fi
}

leasehold_redis_service
