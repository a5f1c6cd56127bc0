#!/usr/bin/env bash
# Before/after: two Tollgate binaries (say, main and a change) under the same load, in alternating turns,
# on the embedded store and on one Redis, through Envoy's API and the native one.
#
#   scripts/bench/bench-ab.sh /path/to/tollgate-before /path/to/tollgate-after
#
# Each turn starts the server fresh (Redis flushed), warms it up for 1 s, then runs the AFTER binary's
# `tollgate bench` (64 in flight, 10,000 keys, DURATION, default 10s; --api envoy and native) against
# it. ROUNDS (default 2) rounds. Only the ratios between turns of one run mean much: on a shared 2-core
# host run-to-run noise is several per cent. Needs redis-server, redis-cli and python3 on PATH.
#
# BEFORE_ENV and AFTER_ENV (space-separated NAME=VALUE words) are given to that side's server only, so
# one binary can be measured against itself with a setting on and off (STORES, default
# `memory redis`, narrows the run to one store):
#   AFTER_ENV='USE_STATSD=true STATSD_PROTOCOL=udp' scripts/bench/bench-ab.sh target/release/tollgate target/release/tollgate
set -euo pipefail
before="$1"
after="$2"
rounds="${ROUNDS:-2}"
duration="${DURATION:-10s}"
# shellcheck source=scripts/bench/bench-lib.sh
source "$(dirname "$0")/bench-lib.sh"

turn() { # name binary store api extra-env
  local name="$1" binary="$2" store="$3" api="$4" extra="$5" port
  port="$(free_port)"
  redis-cli -p "$redis_port" flushall >/dev/null
  local redis_url=""
  [ "$store" = redis ] && redis_url="127.0.0.1:$redis_port"
  # shellcheck disable=SC2086 # $extra is NAME=VALUE words
  env $extra REDIS_URL="$redis_url" "$binary" serve --config-dir "$work/rules" --grpc-addr "127.0.0.1:$port" \
    --http-addr "127.0.0.1:$(free_port)" --debug-addr "127.0.0.1:$(free_port)" >"$work/server.log" 2>&1 &
  server=$!
  wait_ready "$binary" "$port"
  printf '%-7s %-7s %-7s ' "$name" "$store" "$api"
  measure "$after" "http://127.0.0.1:$port" --api "$api"
  stop_server
}

for round in $(seq "$rounds"); do
  for store in ${STORES:-memory redis}; do
    for api in envoy native; do
      turn before "$before" "$store" "$api" "${BEFORE_ENV:-}"
      turn after "$after" "$store" "$api" "${AFTER_ENV:-}"
    done
  done
done
