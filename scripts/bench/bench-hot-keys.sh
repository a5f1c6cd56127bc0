#!/usr/bin/env bash
# Hot-key reservations (TOLLGATE_HOT_KEY_RATE) on and off: Redis CPU and Redis calls per decision for
# one hot key and for 10,000 cold keys at 64 in flight, then the latency of one request in flight on
# the hot key, next to the embedded store's.
#
#   scripts/bench/bench-hot-keys.sh target/release/tollgate
#
# Each turn: a fresh Tollgate on the shared throwaway redis-server (flushed), a 1 s warm-up on the
# measured keys, then `tollgate bench --redis-url` for DURATION (default 10s), which prints
# decisions/s, latency, the Redis process's CPU per decision and its commands per decision. The limit is
# a fixed window of a billion a minute (no load reaches it). HOT_RATE sets TOLLGATE_HOT_KEY_RATE for
# the "on" turns (default 1000). Needs redis-server, redis-cli and python3 on PATH.
set -euo pipefail
binary="$1"
duration="${DURATION:-10s}"
hot_rate="${HOT_RATE:-1000}"
# shellcheck source=scripts/bench/bench-lib.sh
source "$(dirname "$0")/bench-lib.sh"

mkdir -p "$work/hot-rules"
printf 'domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1000000000}\n' \
  > "$work/hot-rules/bench.yaml"

start() { # settings...
  port="$(free_port)"
  env "$@" "$binary" serve --config-dir "$work/hot-rules" --grpc-addr "127.0.0.1:$port" \
    --http-addr "127.0.0.1:$(free_port)" --debug-addr "127.0.0.1:$(free_port)" >"$work/server.log" 2>&1 &
  server=$!
  wait_ready "$binary" "$port"
}

turn() { # label keys concurrency settings...
  local label="$1" keys="$2" concurrency="$3" redis=()
  shift 3
  redis-cli -p "$redis_port" flushall >/dev/null
  start "$@"
  [ "$#" -gt 0 ] && [[ "$1" == REDIS_URL=* ]] && redis=(--redis-url "redis://127.0.0.1:$redis_port")
  "$binary" bench --addr "http://127.0.0.1:$port" --domain bench -d 'user=v-{i}' --keys "$keys" \
    --concurrency "$concurrency" --duration 1s >/dev/null 2>&1
  printf '== %s\n' "$label"
  "$binary" bench --addr "http://127.0.0.1:$port" --domain bench -d 'user=v-{i}' --keys "$keys" \
    --concurrency "$concurrency" --duration "$duration" "${redis[@]}" 2>&1 \
    | grep -E 'decisions/s|errors|latency|redis|calls/decision'
  stop_server
}

redis="REDIS_URL=127.0.0.1:$redis_port"
hot="TOLLGATE_HOT_KEY_RATE=$hot_rate"
turn "one hot key, 64 in flight, reservations off" 1 64 "$redis"
turn "one hot key, 64 in flight, reservations on" 1 64 "$redis" "$hot"
turn "10,000 cold keys, 64 in flight, reservations off" 10000 64 "$redis"
turn "10,000 cold keys, 64 in flight, reservations on" 10000 64 "$redis" "$hot"
turn "one hot key, 1 in flight, reservations off" 1 1 "$redis"
turn "one hot key, 1 in flight, reservations on" 1 1 "$redis" "$hot"
turn "one hot key, 1 in flight, embedded store" 1 1
