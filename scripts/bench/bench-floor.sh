#!/usr/bin/env bash
# Tollgate against its floor: a no-op Envoy RLS server on the same gRPC stack (`tollgate noop-serve`),
# Tollgate on the embedded store and Tollgate on Redis, under the same load generator, in turns, at 64
# requests in flight (4 connections, 10,000 keys) and at one. Prints decisions/s, p50 and p99, and the
# server's CPU per decision (user + system, from /proc) for every turn, on Redis Redis's CPU too; and,
# after the turns at one in flight, the same Redis's own PING round trip at one in flight
# (redis-benchmark, 20,000 PINGs), so that Redis mode's p50 can be set against "no-op p50 + PING p50".
#
#   scripts/bench/bench-floor.sh target/release/tollgate
#
# Every server runs for the whole measurement; ROUNDS (default 2) rounds of DURATION (default 10s)
# turns. The rules are bench-lib's (a token bucket no load reaches). Needs redis-server, redis-cli,
# redis-benchmark (all three in Debian's redis-tools and redis-server) and python3 on PATH.
set -euo pipefail
binary="$1"
rounds="${ROUNDS:-2}"
duration="${DURATION:-10s}"
# shellcheck source=scripts/bench/bench-lib.sh
source "$(dirname "$0")/bench-lib.sh"
start_floor_servers "$binary"

turn() { # name concurrency connections
  local name="$1" concurrency="$2" connections="$3" before after redis_before redis_after out
  "$binary" bench --addr "http://127.0.0.1:${port[$name]}" --domain bench -d 'user=w-{i}' --keys 100 \
    --concurrency 8 --duration 1s >/dev/null 2>&1
  before="$(ticks "${pid[$name]}")"
  redis_before="$(ticks "$redis_pid")"
  out="$("$binary" bench --addr "http://127.0.0.1:${port[$name]}" --domain bench -d 'user=u-{i}' \
    --keys 10000 --concurrency "$concurrency" --connections "$connections" --duration "$duration" 2>&1)"
  after="$(ticks "${pid[$name]}")"
  redis_after="$(ticks "$redis_pid")"
  python3 - "$name" "$concurrency" "$before" "$after" "$redis_before" "$redis_after" "$hz" "$out" <<'EOF'
import re, sys
name, concurrency, before, after, redis_before, redis_after, hz, out = sys.argv[1:]
requests = int(re.search(r"requests:\s+(\d+)", out).group(1))
rate = re.search(r"\(([\d.]+) decisions/s\)", out).group(1)
latency = re.search(r"p50 (\S+)\s+p90 \S+\s+p99 (\S+)", out)
def per_decision(a, b):
    return (int(b) - int(a)) / int(hz) * 1e6 / max(requests, 1)
redis = f"  Redis CPU {per_decision(redis_before, redis_after):5.1f} µs" if name == "redis" else ""
print(f"{name:9} {concurrency:>3} in flight: {float(rate):>8.0f} decisions/s  p50 {latency.group(1):>9}  "
      f"p99 {latency.group(2):>9}  server CPU {per_decision(before, after):6.1f} µs/decision{redis}")
EOF
}

for round in $(seq "$rounds"); do
  echo "== round $round"
  for name in noop embedded redis; do turn "$name" 64 4; done
  for name in noop embedded redis; do turn "$name" 1 1; done
  redis_ping
done
