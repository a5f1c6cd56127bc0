#!/usr/bin/env bash
# Redis CPU per decision, for every algorithm and for 1 and 3 descriptors, next to the floor: the same
# load sent straight to Redis as envoyproxy/ratelimit counts a fixed window (INCRBY + EXPIRE per
# descriptor, pipelined per request, `tollgate bench --api redis-floor`).
#
#   scripts/bench/bench-redis-cpu.sh target/release/tollgate [workload ...]
#
# Workloads (all by default): floor-1 fixed-1 floor-3 fixed-3 token-bucket gcra sliding-window
# sliding-log.
#
# Each turn: a fresh Tollgate on the shared throwaway redis-server (flushed), a 1 s warm-up, then
# `tollgate bench --redis-url` (64 in flight, DURATION, default 10s), which prints the Redis process CPU
# per decision and the most expensive commands from INFO commandstats. RATE=N sends N requests a second
# instead (open loop, still at most 64 in flight), for the cost at a load below the peak; TOLLGATE_ENV
# passes settings to the server under test (e.g. TOLLGATE_ENV='REDIS_PIPELINE_WINDOW=150us'). Needs
# redis-server, redis-cli and python3 on PATH.
set -euo pipefail
binary="$1"
shift
[ "$#" -gt 0 ] || set -- floor-1 fixed-1 floor-3 fixed-3 token-bucket gcra sliding-window sliding-log
duration="${DURATION:-10s}"
# shellcheck source=scripts/bench/bench-lib.sh
source "$(dirname "$0")/bench-lib.sh"

rules() { # algorithm limit unit
  mkdir -p "$work/cpu-rules"
  {
    echo "domain: bench"
    echo "descriptors:"
    for key in user path ip; do
      echo "  - key: $key"
      echo "    rate_limit: {unit: $3, requests_per_unit: $2, algorithm: $1}"
    done
  } > "$work/cpu-rules/bench.yaml"
}

bench() { # label keys descriptors... (then the bench's own arguments after --)
  local label="$1" keys="$2"
  shift 2
  printf '== %s\n' "$label"
  "$binary" bench --addr "http://127.0.0.1:$port" --domain bench --keys "$keys" --concurrency 64 \
    ${RATE:+--rate "$RATE"} --duration "$duration" --redis-url "redis://127.0.0.1:$redis_port" "$@" 2>&1 \
    | grep -E 'decisions/s|errors|latency|redis|calls/decision'
}

turn() { # label algorithm limit unit keys descriptor-count
  local label="$1" algorithm="$2" limit="$3" unit="$4" keys="$5" count="$6" args=()
  rules "$algorithm" "$limit" "$unit"
  for key in user path ip; do
    [ "${#args[@]}" -lt $((count * 2)) ] && args+=(-d "$key=v-{i}")
  done
  redis-cli -p "$redis_port" flushall >/dev/null
  port="$(free_port)"
  # shellcheck disable=SC2086 # TOLLGATE_ENV is a list of settings
  env ${TOLLGATE_ENV:-} REDIS_URL="127.0.0.1:$redis_port" "$binary" serve --config-dir "$work/cpu-rules" \
    --grpc-addr "127.0.0.1:$port" --http-addr "127.0.0.1:$(free_port)" \
    --debug-addr "127.0.0.1:$(free_port)" >"$work/server.log" 2>&1 &
  server=$!
  wait_ready "$binary" "$port"
  "$binary" bench --addr "http://127.0.0.1:$port" --domain bench -d 'user=w-{i}' --keys 100 \
    --concurrency 8 --duration 1s >/dev/null 2>&1
  bench "$label" "$keys" "${args[@]}"
  stop_server
}

floor() { # label descriptor-count
  local args=(-d 'user=v-{i}')
  [ "$2" -ge 3 ] && args+=(-d 'path=v-{i}' -d 'ip=v-{i}')
  redis-cli -p "$redis_port" flushall >/dev/null
  port=0
  bench "$1" 10000 --api redis-floor "${args[@]}"
}

# Limits no load reaches, except the sliding log's, which holds up to 100 entries a key. 1,000 a day
# and not a billion a minute: at a billion a minute a bucket refills between two hits on its key
# (10,000 keys, a few hits a key a second), so its state has expired and every decision took the
# no-state path. At 1,000 a day the states live, as they do for a limit that matters.
for workload in "$@"; do
  case "$workload" in
    floor-1) floor "floor: INCRBY+EXPIRE, 1 descriptor" 1 ;;
    fixed-1) turn "fixed_window, 1 descriptor" fixed_window 1000000000 minute 10000 1 ;;
    floor-3) floor "floor: INCRBY+EXPIRE, 3 descriptors" 3 ;;
    fixed-3) turn "fixed_window, 3 descriptors" fixed_window 1000000000 minute 10000 3 ;;
    token-bucket) turn "token_bucket, 1 descriptor" token_bucket 1000 day 10000 1 ;;
    gcra) turn "gcra, 1 descriptor" gcra 1000 day 10000 1 ;;
    sliding-window) turn "sliding_window, 1 descriptor" sliding_window 1000 day 10000 1 ;;
    sliding-log) turn "sliding_log, 1 descriptor, 100 entries a key" sliding_log 100 minute 1000 1 ;;
    *) echo "unknown workload: $workload" >&2; exit 2 ;;
  esac
done
