#!/usr/bin/env bash
# Tollgate against its floor: a no-op Envoy RLS server on the same gRPC stack (`tollgate noop-serve`),
# Tollgate on the embedded store and Tollgate on Redis, under the same load generator, in turns, at 64
# requests in flight (4 connections, 10,000 keys) and at one. Prints decisions/s, p50 and p99, and the
# server's CPU per decision (user + system, from /proc) for every turn.
#
#   scripts/bench-floor.sh target/release/tollgate
#
# Every server runs for the whole measurement; ROUNDS (default 2) rounds of DURATION (default 10s)
# turns. The rules are bench-lib's (a token bucket no load reaches). Needs redis-server, redis-cli and
# python3 on PATH.
set -euo pipefail
binary="$1"
rounds="${ROUNDS:-2}"
duration="${DURATION:-10s}"
pids=()
cleanup_more() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
# shellcheck source=scripts/bench-lib.sh
source "$(dirname "$0")/bench-lib.sh"

declare -A port pid
start() { # name command...
  local name="$1"
  shift
  port[$name]="$(free_port)"
  "$@" --grpc-addr "127.0.0.1:${port[$name]}" >"$work/$name.log" 2>&1 &
  pid[$name]=$!
  pids+=("$!")
}
start noop "$binary" noop-serve
start embedded "$binary" serve --config-dir "$work/rules" --http-addr "127.0.0.1:$(free_port)" \
  --debug-addr "127.0.0.1:$(free_port)"
start redis env REDIS_URL="127.0.0.1:$redis_port" "$binary" serve --config-dir "$work/rules" \
  --http-addr "127.0.0.1:$(free_port)" --debug-addr "127.0.0.1:$(free_port)"
sleep 1
wait_ready "$binary" "${port[embedded]}"
wait_ready "$binary" "${port[redis]}"

# CPU ticks (user + system) the process has used.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz="$(getconf CLK_TCK)"

turn() { # name concurrency connections
  local name="$1" concurrency="$2" connections="$3" before after out
  "$binary" bench --addr "http://127.0.0.1:${port[$name]}" --domain bench -d 'user=w-{i}' --keys 100 \
    --concurrency 8 --duration 1s >/dev/null 2>&1
  before="$(ticks "${pid[$name]}")"
  out="$("$binary" bench --addr "http://127.0.0.1:${port[$name]}" --domain bench -d 'user=u-{i}' \
    --keys 10000 --concurrency "$concurrency" --connections "$connections" --duration "$duration" 2>&1)"
  after="$(ticks "${pid[$name]}")"
  python3 - "$name" "$concurrency" "$before" "$after" "$hz" "$out" <<'EOF'
import re, sys
name, concurrency, before, after, hz, out = sys.argv[1:]
requests = int(re.search(r"requests:\s+(\d+)", out).group(1))
rate = re.search(r"\(([\d.]+) decisions/s\)", out).group(1)
latency = re.search(r"p50 (\S+)\s+p90 \S+\s+p99 (\S+)", out)
cpu_us = (int(after) - int(before)) / int(hz) * 1e6 / max(requests, 1)
print(f"{name:9} {concurrency:>3} in flight: {float(rate):>8.0f} decisions/s  p50 {latency.group(1):>9}  "
      f"p99 {latency.group(2):>9}  server CPU {cpu_us:6.1f} µs/decision")
EOF
}

for round in $(seq "$rounds"); do
  echo "== round $round"
  for name in noop embedded redis; do turn "$name" 64 4; done
  for name in noop embedded redis; do turn "$name" 1 1; done
done
