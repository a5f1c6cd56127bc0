#!/usr/bin/env bash
# Redis CPU per decision on a Redis Cluster: three masters on this host (no replicas), their CPU
# (INFO cpu, user + system) summed over a `tollgate bench` run at 64 in flight on 10,000 keys a
# descriptor. The single-node figures come from scripts/bench/bench-redis-cpu.sh, with the same workloads.
#
#   scripts/bench/bench-redis-cluster-cpu.sh target/release/tollgate [workload ...]
#
# Workloads (all by default): fixed-1 fixed-3 token-bucket-1 token-bucket-3. DURATION of load (default
# 8s) after a 2 s warm-up. RATE=N sends N requests a second (open loop) instead of keeping 64 in flight;
# TOLLGATE_ENV passes settings to the server (e.g. TOLLGATE_ENV='REDIS_PIPELINE_WINDOW=500us'). Needs
# redis-server, redis-cli and python3.
set -euo pipefail
binary="$1"
shift
[ "$#" -gt 0 ] || set -- fixed-1 fixed-3 token-bucket-1 token-bucket-3
duration="${DURATION:-8s}"
work="$(mktemp -d)"
nodes=()
server=""
cleanup() {
  [ -z "$server" ] || kill "$server" 2>/dev/null || true
  for port in "${nodes[@]}"; do redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# A free loopback port a cluster node can take: its bus port (10,000 higher) must exist too.
node_port() {
  python3 -c '
import socket
while True:
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    if port <= 55000: print(port); break'
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

for _ in 1 2 3; do
  port="$(node_port)"
  mkdir -p "$work/node-$port"
  (cd "$work/node-$port" && redis-server --port "$port" --cluster-enabled yes --cluster-node-timeout 2000 \
    --save '' --appendonly no --daemonize yes --logfile "$work/node-$port/log")
  nodes+=("$port")
done
for port in "${nodes[@]}"; do until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.1; done; done
redis-cli --cluster create "${nodes[@]/#/127.0.0.1:}" --cluster-replicas 0 --cluster-yes >/dev/null
for port in "${nodes[@]}"; do
  until redis-cli -p "$port" cluster info | grep -q cluster_state:ok; do sleep 0.2; done
done
seeds="$(IFS=,; echo "${nodes[*]/#/127.0.0.1:}")"

# The CPU seconds (user + system) all nodes have used so far.
cluster_cpu() {
  for port in "${nodes[@]}"; do redis-cli -p "$port" info cpu; done | tr -d '\r' \
    | awk -F: '/^used_cpu_(sys|user):/ { total += $2 } END { printf "%.6f\n", total }'
}

turn() { # label algorithm limit unit descriptor-count
  local label="$1" count="$5" port args=(-d 'user=v-{i}')
  [ "$count" -ge 3 ] && args+=(-d 'path=v-{i}' -d 'ip=v-{i}')
  mkdir -p "$work/rules"
  {
    echo "domain: bench"
    echo "descriptors:"
    for key in user path ip; do
      echo "  - key: $key"
      echo "    rate_limit: {unit: $4, requests_per_unit: $3, algorithm: $2}"
    done
  } > "$work/rules/bench.yaml"
  for node in "${nodes[@]}"; do redis-cli -p "$node" flushall >/dev/null; done
  port="$(free_port)"
  # shellcheck disable=SC2086 # TOLLGATE_ENV is a list of settings
  env ${TOLLGATE_ENV:-} REDIS_TYPE=cluster REDIS_URL="$seeds" "$binary" serve --config-dir "$work/rules" \
    --grpc-addr "127.0.0.1:$port" --http-addr "127.0.0.1:$(free_port)" \
    --debug-addr "127.0.0.1:$(free_port)" >"$work/server.log" 2>&1 &
  server=$!
  until "$binary" healthcheck --addr "http://127.0.0.1:$port" --timeout 200ms >/dev/null 2>&1; do sleep 0.1; done
  "$binary" bench --addr "http://127.0.0.1:$port" --domain bench --keys 10000 --concurrency 64 \
    --duration 2s "${args[@]}" >/dev/null 2>&1
  local before after output
  before="$(cluster_cpu)"
  output="$("$binary" bench --addr "http://127.0.0.1:$port" --domain bench --keys 10000 \
    --concurrency 64 ${RATE:+--rate "$RATE"} --duration "$duration" "${args[@]}" 2>&1)"
  after="$(cluster_cpu)"
  kill "$server"
  wait "$server" 2>/dev/null || true
  server=""
  printf '== %s\n%s\n' "$label" "$(grep -E 'decisions/s|errors|latency' <<<"$output")"
  python3 -c "import re, sys; n = int(re.search(r'requests:\s+(\d+)', sys.argv[3]).group(1)); \
print(f'redis:       {1e6 * (float(sys.argv[2]) - float(sys.argv[1])) / n:.2f} µs process CPU per decision, three masters summed')" \
    "$before" "$after" "$output"
}

for workload in "$@"; do
  case "$workload" in
    fixed-1) turn "fixed_window, 1 descriptor" fixed_window 1000000000 minute 1 ;;
    fixed-3) turn "fixed_window, 3 descriptors" fixed_window 1000000000 minute 3 ;;
    token-bucket-1) turn "token_bucket, 1 descriptor" token_bucket 1000 day 1 ;;
    token-bucket-3) turn "token_bucket, 3 descriptors" token_bucket 1000 day 3 ;;
    *) echo "unknown workload: $workload" >&2; exit 2 ;;
  esac
done
