#!/bin/bash
# Server instructions per call of the Redis mutex scripts' uncontended
# path (docs/fairness.md, "Measured on Redis"): a private redis-server under
# `valgrind --tool=callgrind --toggle-collect=evalShaCommand`, N fresh keys
# acquired, then released, through `redis-cli --pipe`, with the keys and
# arguments a call that does not queue sends (backends/redis/exec.rs).
# Instructions, not time: a shared 2-core machine swings wall-clock figures
# by tens of percent, instruction counts by under 1 %.
#
# usage: scripts/redis-script-cost.sh [SRC_DIR] [PORT] [N]
#   SRC_DIR: a checkout's crates/leasehold/src/backends/redis (default: this
#   one's); a version before queues (no queue.lua) is measured as it was.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
src=${1:-$here/crates/leasehold/src/backends/redis}
port=${2:-6399}
n=${3:-3000}
work=$(mktemp -d)
trap 'redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

# The scripts as mod.rs assembles them.
if [ -f "$src/queue.lua" ]; then
  cat "$src"/{idle,fence,acquire,queue,acquire_queued}.lua > "$work/acquire.lua"
  cat "$src"/{release,idle,fence,queue,release_queued}.lua > "$work/release.lua"
else
  cat "$src"/{idle,fence,acquire}.lua > "$work/acquire.lua"
  cp "$src/release.lua" "$work/release.lua"
fi

valgrind --tool=callgrind --toggle-collect=evalShaCommand \
  --callgrind-out-file="$work/cg.out" \
  redis-server --port "$port" --save '' --appendonly no >"$work/server.log" 2>&1 &
server=$!
for _ in $(seq 150); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.2; done
asha=$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$work/acquire.lua")")
rsha=$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$work/release.lua")")

# RESP for `redis-cli --pipe`: fences set first (a counter the clock
# started, with a ttl, as a grant finds it), then the grants, then the
# releases of exactly those grants (token = fence + 1).
gen() {
  python3 - "$1" "$n" "$asha" "$rsha" <<'PY'
import sys
what, n, asha, rsha = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def resp(*args):
    out = ["*%d\r\n" % len(args)]
    for a in args:
        a = str(a)
        out.append("$%d\r\n%s\r\n" % (len(a.encode()), a))
    return "".join(out)
owner, fence, idle = "0123456789abcdef0123456789abcdef", 1800000000000000, 3600000
for i in range(n):
    lock, fkey, kind = "p:lock:{k%d}" % i, "p:fence:{k%d}" % i, "p:kind:{k%d}" % i
    if what == "setup":
        sys.stdout.write(resp("SET", fkey, fence, "PX", idle + idle // 2))
    elif what == "acquire":
        sys.stdout.write(resp("EVALSHA", asha, 3, lock, fkey, kind, owner, 60000, "host:1234", idle))
    else:
        sys.stdout.write(resp("EVALSHA", rsha, 2, lock, fkey, "%s#%d:" % (owner, fence + 1),
                              "p:released", "k%d" % i, idle))
PY
}
gen setup | redis-cli -p "$port" --pipe >/dev/null
callgrind_control -z "$server" >/dev/null 2>&1
gen acquire | redis-cli -p "$port" --pipe >/dev/null
callgrind_control -d acquire "$server" >/dev/null 2>&1
gen release | redis-cli -p "$port" --pipe >/dev/null
callgrind_control -d release "$server" >/dev/null 2>&1
left=$(redis-cli -p "$port" DBSIZE)
[ "$left" = "$n" ] || echo "warning: $left keys left, expected the $n fences" >&2
redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
wait "$server" || true
for part in 1 2; do
  what=$([ $part = 1 ] && echo grant || echo release)
  ir=$(grep -E '^(summary|totals):' "$work/cg.out.$part" | head -1 | awk '{print $2}')
  echo "$what: $((ir / n)) instructions per call"
done
