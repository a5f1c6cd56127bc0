# Shared by the bench scripts (sourced, not run): a work directory and a throwaway redis-server, both
# removed on exit, and free loopback ports. Needs redis-server, redis-cli and python3 on PATH.
#
# After sourcing: $work (a temporary directory) with the benchmark's rules in $work/rules (domain bench,
# key user, a token bucket no load reaches), $redis_port (a running redis-server, no persistence),
# free_port, wait_ready BINARY PORT [SECONDS], measure BINARY ADDR [bench options], stop_server, $server
# (the pid of the Tollgate the script started last: killed on exit), and an EXIT trap that runs
# `bench_cleanup` plus whatever the script put in `cleanup_more` (a function it may define); `start NAME
# COMMAND...` runs a server on a free gRPC port (killed on exit), `ticks PID` its CPU so far.

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Writes to PATH a rules file of ROUTES routes shaped as Envoy Gateway shapes them: one domain, one
# top-level descriptor per route rule named after it (`httproute/default/route-N/rule/0/match/0`, as key
# and value), a client selector below it (`x-user-id`): three levels.
eg_rules_file() { # ROUTES PATH
  python3 - "$1" "$2" <<'EOF'
import sys
routes, path = int(sys.argv[1]), sys.argv[2]
with open(path, "w") as out:
    out.write("domain: default/eg/http\ndescriptors:\n")
    for i in range(routes):
        name = f"httproute/default/route-{i}/rule/0/match/0"
        out.write(f"  - key: {name}\n    value: {name}\n    descriptors:\n"
                  "      - key: rule-0-match-0\n        value: rule-0-match-0\n        descriptors:\n"
                  "          - key: x-user-id\n"
                  "            rate_limit: {unit: minute, requests_per_unit: 100}\n")
EOF
}

# Waits (up to SECONDS, default 10) until the Tollgate BINARY on gRPC PORT reports SERVING.
wait_ready() {
  local binary="$1" port="$2" tries=$(( ${3:-10} * 10 ))
  until "$binary" healthcheck --addr "http://127.0.0.1:$port" --timeout 200ms >/dev/null 2>&1; do
    tries=$((tries - 1))
    [ "$tries" -gt 0 ] || { echo "the server on port $port never became ready" >&2; return 1; }
    sleep 0.1
  done
}

# A 1 s warm-up, then the measured load: 64 in flight, 10,000 keys, for $duration (default 10s),
# printed on one line. Extra arguments (--api, TLS options) go to both runs.
measure() {
  local binary="$1" addr="$2"
  shift 2
  "$binary" bench --addr "$addr" "$@" --domain bench -d 'user=w-{i}' --keys 100 --concurrency 8 \
    --duration 1s >/dev/null 2>&1
  "$binary" bench --addr "$addr" "$@" --domain bench -d 'user=u-{i}' --keys 10000 --concurrency 64 \
    --duration "${duration:-10s}" 2>&1 | grep -E 'decisions|errors|latency' | tr -s ' ' | tr '\n' ' '
  echo
}

# Starts a server in the background on a free gRPC port: `start NAME COMMAND...` appends
# `--grpc-addr 127.0.0.1:PORT`; its port is ${port[NAME]}, its pid ${pid[NAME]} (also in $pids, killed on
# exit), its output in $work/NAME.log.
declare -A port pid
pids=()
start() {
  local name="$1"
  shift
  port[$name]="$(free_port)"
  "$@" --grpc-addr "127.0.0.1:${port[$name]}" >"$work/$name.log" 2>&1 &
  pid[$name]=$!
  pids+=("$!")
}

# CPU ticks (user + system) process PID has used; $hz ticks make a second.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz="$(getconf CLK_TCK)"

# The three servers a floor is measured with, on the bench rules: `noop` (`tollgate noop-serve`),
# `embedded` and `redis` (on $redis_port), ready on return; $redis_pid is Redis's pid.
start_floor_servers() { # BINARY
  local binary="$1"
  start noop "$binary" noop-serve
  start embedded "$binary" serve --config-dir "$work/rules" --http-addr "127.0.0.1:$(free_port)" \
    --debug-addr "127.0.0.1:$(free_port)"
  start redis env REDIS_URL="127.0.0.1:$redis_port" "$binary" serve --config-dir "$work/rules" \
    --http-addr "127.0.0.1:$(free_port)" --debug-addr "127.0.0.1:$(free_port)"
  sleep 1
  wait_ready "$binary" "${port[embedded]}"
  wait_ready "$binary" "${port[redis]}"
  redis_pid="$(redis-cli -p "$redis_port" info server | awk -F: '/^process_id:/ {print $2}' | tr -d '\r')"
}

# Redis's own round trip at one in flight (redis-benchmark, 20,000 PINGs): prints its rate, its p50 and
# Redis's CPU per PING (user + system), the cost of one bare round trip on the Redis side.
redis_ping() {
  local before csv
  before="$(ticks "$redis_pid")"
  csv="$(redis-benchmark -p "$redis_port" -c 1 -n 20000 -t ping_mbulk --csv)"
  python3 -c 'import csv, io, sys
row = list(csv.DictReader(io.StringIO(sys.argv[1])))[0]
rate, p50 = float(row["rps"]), float(row["p50_latency_ms"]) * 1000
cpu = (int(sys.argv[3]) - int(sys.argv[2])) / int(sys.argv[4]) * 1e6 / 20000
print(f"redis PING  1 in flight: {rate:>8.0f} round trips/s  p50 {p50:6.0f}µs  Redis CPU {cpu:5.1f} µs/PING")' \
    "$csv" "$before" "$(ticks "$redis_pid")" "$hz"
}

# Stops the server the script started last (its pid in $server).
stop_server() {
  kill "$server"
  wait "$server" 2>/dev/null || true
  server=""
}

bench_cleanup() {
  [ -z "$server" ] || kill "$server" 2>/dev/null || true
  for started in "${pids[@]}"; do kill "$started" 2>/dev/null || true; done
  if declare -F cleanup_more >/dev/null; then cleanup_more; fi
  [ -n "${redis_port:-}" ] && redis-cli -p "$redis_port" shutdown nosave >/dev/null 2>&1
  rm -rf "$work"
}

server=""
work="$(mktemp -d)"
trap bench_cleanup EXIT
redis_port="$(free_port)"
redis-server --port "$redis_port" --save '' --appendonly no --daemonize yes --logfile "$work/redis.log"
until redis-cli -p "$redis_port" ping >/dev/null 2>&1; do sleep 0.1; done

mkdir -p "$work/rules"
cat > "$work/rules/bench.yaml" <<'RULES'
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000000000, algorithm: token_bucket}
RULES
