#!/usr/bin/env bash
# Instructions Redis executes per fixed-window decision, end to end: reading and parsing the requests,
# running the commands, writing the replies (callgrind, --toggle-collect on readQueryFromClient and
# handleClientsWithPendingWritesUsingThreads), for Tollgate's pipelines and for the Go service's way
# (`tollgate bench --api redis-floor`: INCRBY + EXPIRE per descriptor, a pipeline per request). Unlike
# the Redis CPU time of scripts/bench/bench-redis-cpu.sh, the count hardly moves with the host's load (two
# runs agree within about 2 %).
#
#   scripts/bench/bench-redis-pipeline-instructions.sh target/release/tollgate [workload ...]
#
# Workloads (all by default): fixed-1 fixed-3 floor-1 floor-3 (one or three descriptors, 10,000 keys
# each, 64 in flight, DURATION of load, default 15s). A decision is counted where Redis counted it, one
# INCRBY per descriptor, since under callgrind Tollgate's queue backs up and the bench stops before the
# last of it is sent. The scripted algorithms are measured by scripts/bench/bench-redis-script-instructions.sh.
# Needs valgrind, redis-server, redis-cli and python3.
set -euo pipefail
binary="$1"
shift
[ "$#" -gt 0 ] || set -- fixed-1 fixed-3 floor-1 floor-3
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 2; }
duration="${DURATION:-15s}"
valgrind_pid=""
cleanup_more() { [ -z "$valgrind_pid" ] || kill "$valgrind_pid" 2>/dev/null || true; }
# shellcheck source=scripts/bench/bench-lib.sh
source "$(dirname "$0")/bench-lib.sh"

mkdir -p "$work/fixed-rules"
{
  echo "domain: bench"
  echo "descriptors:"
  for key in user path ip; do
    echo "  - key: $key"
    echo "    rate_limit: {unit: minute, requests_per_unit: 1000000000}"
  done
} > "$work/fixed-rules/bench.yaml"

run() { # workload
  local kind="${1%-*}" count="${1#*-}" out="$work/callgrind.out" port args=(-d 'user=v-{i}') extra=()
  [ "$count" -ge 3 ] && args+=(-d 'path=v-{i}' -d 'ip=v-{i}')
  local cg_port
  cg_port="$(free_port)"
  valgrind --tool=callgrind --callgrind-out-file="$out" --toggle-collect=readQueryFromClient \
    --toggle-collect=handleClientsWithPendingWritesUsingThreads \
    redis-server --port "$cg_port" --save '' --appendonly no >"$work/valgrind.log" 2>&1 &
  valgrind_pid=$!
  until redis-cli -p "$cg_port" ping >/dev/null 2>&1; do sleep 0.2; done
  port="$(free_port)"
  if [ "$kind" = floor ]; then
    extra=(--api redis-floor --redis-url "redis://127.0.0.1:$cg_port")
  else
    REDIS_URL="127.0.0.1:$cg_port" "$binary" serve --config-dir "$work/fixed-rules" \
      --grpc-addr "127.0.0.1:$port" --http-addr "127.0.0.1:$(free_port)" \
      --debug-addr "127.0.0.1:$(free_port)" >"$work/server.log" 2>&1 &
    server=$!
    wait_ready "$binary" "$port"
  fi
  "$binary" bench --addr "http://127.0.0.1:$port" --domain bench --keys 10000 --concurrency 64 \
    --duration "$duration" "${args[@]}" "${extra[@]}" >/dev/null 2>&1
  [ -z "$server" ] || stop_server
  local stats
  stats="$(redis-cli -p "$cg_port" info commandstats | tr -d '\r')"
  redis-cli -p "$cg_port" shutdown nosave >/dev/null 2>&1 || true
  wait "$valgrind_pid" 2>/dev/null || true
  valgrind_pid=""
  python3 - "$1" "$count" "$out" "$stats" <<'PY'
import re, sys
workload, count, out, stats = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
total = next(int(line.split()[1]) for line in open(out) if line.startswith(("totals:", "summary:")))
calls = {m[0]: int(m[1]) for m in re.findall(r"cmdstat_(\w+):calls=(\d+)", stats)}
decisions = calls.get("incrby", 0) // count
expires = calls.get("expire", 0) / max(decisions, 1)
print(f"{workload:8} {total // max(decisions, 1):>7} instructions per decision "
      f"({decisions} decisions, {expires:.3f} EXPIRE per decision)")
PY
}

for workload in "$@"; do
  case "$workload" in
    fixed-1 | fixed-3 | floor-1 | floor-3) run "$workload" ;;
    *) echo "unknown workload: $workload" >&2; exit 2 ;;
  esac
done
