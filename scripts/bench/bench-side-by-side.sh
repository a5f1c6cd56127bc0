#!/usr/bin/env bash
# Side by side on one Redis: Tollgate and other Envoy RLS servers under the same load, measured in turns.
#
#   cargo build --release --locked
#   scripts/bench/bench-side-by-side.sh 'peer-mt=/path/to/peer-rls --port {port} --redis-url {redis_url}' ...
#
# Each argument is `name=command`; `{port}` becomes a free gRPC port and `{redis_url}` the shared Redis
# (`redis://127.0.0.1:PORT`). The peer must answer domain `bench`, descriptor `user=<value>`, with a limit
# that never refuses during the run. Every server runs for the whole measurement; each round runs
# `tollgate bench` (64 in flight, 4 connections, 10,000 keys, DURATION, default 10s) against each in turn,
# after flushing Redis. ROUNDS (default 3) rounds. Prints decisions/s, latency and Redis commands per
# decision for every run. Needs redis-server and redis-cli on PATH.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
tollgate="$("$root/scripts/binary-path.sh" release)"
[ -x "$tollgate" ] || { echo "build first: cargo build --release --locked" >&2; exit 1; }
rounds="${ROUNDS:-3}"
duration="${DURATION:-10s}"
pids=()
cleanup_more() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
# shellcheck source=scripts/bench/bench-lib.sh
source "$(dirname "$0")/bench-lib.sh"
redis_url="redis://127.0.0.1:$redis_port"

mkdir -p "$work/rules"
cat > "$work/rules/bench.yaml" <<'EOF'
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000000000}
EOF

names=(tollgate)
ports=("$(free_port)")
REDIS_URL="127.0.0.1:$redis_port" "$tollgate" serve --config-dir "$work/rules" \
  --grpc-addr "127.0.0.1:${ports[0]}" --http-addr "127.0.0.1:$(free_port)" \
  --debug-addr "127.0.0.1:$(free_port)" >"$work/tollgate.log" 2>&1 &
pids+=("$!")
for spec in "$@"; do
  name="${spec%%=*}"
  command="${spec#*=}"
  port="$(free_port)"
  command="${command//\{port\}/$port}"
  command="${command//\{redis_url\}/$redis_url}"
  bash -c "exec $command" >"$work/$name.log" 2>&1 &
  pids+=("$!")
  names+=("$name")
  ports+=("$port")
done
sleep 2
# Warm-up: connections made, scripts loaded, before anything is measured.
for port in "${ports[@]}"; do
  "$tollgate" bench --addr "http://127.0.0.1:$port" --domain bench -d 'user=w-{i}' --keys 100 \
    --concurrency 8 --duration 1s >/dev/null 2>&1
done

for round in $(seq "$rounds"); do
  for i in "${!names[@]}"; do
    redis-cli -p "$redis_port" flushall >/dev/null
    printf 'round %s %-12s ' "$round" "${names[$i]}"
    "$tollgate" bench --addr "http://127.0.0.1:${ports[$i]}" --domain bench -d 'user=u-{i}' \
      --keys 10000 --concurrency 64 --duration "$duration" --redis-url "$redis_url" 2>&1 \
      | grep -E 'decisions|latency|redis:' | tr -s ' ' | tr '\n' ' '
    echo
  done
done
