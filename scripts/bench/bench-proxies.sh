#!/usr/bin/env bash
# What Tollgate costs a request that goes through NGINX or Caddy. For each proxy, four set-ups of the
# example configuration (examples/nginx/tollgate.conf, examples/caddy/Caddyfile, ports and domain
# changed), each in front of the same application (an NGINX answering 200 from memory):
#   alone     the proxy with no question asked (the example without its auth_request / forward_auth);
#   noop      asking `tollgate noop-serve --http-addr`, which answers 200 on the same HTTP stack;
#   embedded  asking Tollgate on the embedded store;
#   redis     asking Tollgate on Redis.
# wrk drives each in turns, at 64 requests in flight (2 threads) and at one, every request a user of
# 10,000 (X-User, which the rules' proxy block makes the descriptor), none ever refused. Prints
# requests/s, p50 and p99, and the CPU per request of the proxy, of Tollgate (or the no-op) and of Redis.
#
#   scripts/bench/bench-proxies.sh target/release/tollgate
#
# ROUNDS (default 2) rounds of DURATION (default 10s) turns. Needs nginx, caddy, wrk, redis-server,
# redis-cli (Debian's packages) and python3.
set -euo pipefail
binary="$(realpath "$1")"
rounds="${ROUNDS:-2}"
duration="${DURATION:-10s}"
repo="$(cd "$(dirname "$0")/../.." && pwd)"
pids=()
cleanup_more() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
# shellcheck source=scripts/bench/bench-lib.sh
source "$(dirname "$0")/bench-lib.sh"

mkdir -p "$work/proxy-rules"
cat >"$work/proxy-rules/bench.yaml" <<'RULES'
domain: bench
proxy:
  rate_limits:
    - actions: [{request_headers: {header_name: x-user, descriptor_key: user}}]
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000000000, algorithm: token_bucket}
RULES
cat >"$work/user.lua" <<'LUA'
local n = 0
request = function()
  n = n + 1
  return wrk.format(nil, "/", { ["X-User"] = "u-" .. (n % 10000) })
end
LUA

# The backends' HTTP ports (their gRPC and debug ports are not used).
declare -A http
for name in noop embedded redis; do http[$name]="$(free_port)"; done
backend() { # name command...
  local name="$1"
  shift
  "$@" >"$work/$name.log" 2>&1 &
  pids+=("$!")
  echo "$!" >"$work/$name.pid"
}
backend noop "$binary" noop-serve --grpc-addr "127.0.0.1:$(free_port)" --http-addr "127.0.0.1:${http[noop]}"
for name in embedded redis; do
  store=()
  [ "$name" = embedded ] || store=(env "REDIS_URL=127.0.0.1:$redis_port")
  backend "$name" "${store[@]}" "$binary" serve --config-dir "$work/proxy-rules" \
    --grpc-addr "127.0.0.1:$(free_port)" --http-addr "127.0.0.1:${http[$name]}" \
    --debug-addr "127.0.0.1:$(free_port)"
done
for name in embedded redis; do
  until curl -sf "http://127.0.0.1:${http[$name]}/healthcheck" >/dev/null; do sleep 0.1; done
done

# The application: an NGINX answering from memory, one worker.
app_port="$(free_port)"
mkdir -p "$work/app"
cat >"$work/app/nginx.conf" <<EOF
pid $work/app/nginx.pid;
worker_processes 1;
events { worker_connections 1024; }
http {
  access_log off;
  server { listen 127.0.0.1:$app_port; location / { return 200 "ok\n"; } }
}
EOF
nginx -p "$work/app" -e "$work/app/error.log" -c "$work/app/nginx.conf" -g 'daemon off;' &
pids+=("$!")

declare -A port
# NGINX set-up NAME asking the backend on port TOLLGATE (none for `alone`).
nginx_setup() { # name tollgate-port
  local name="nginx-$1" dir="$work/nginx-$1"
  port[$name]="$(free_port)"
  mkdir -p "$dir/temp"
  chmod 777 "$dir" "$dir/temp"
  sed -e "s/127.0.0.1:8080/127.0.0.1:$2/; s/127.0.0.1:9000/127.0.0.1:$app_port/" \
    -e "s/listen 8000;/listen 127.0.0.1:${port[$name]};/; s#/forward-auth/api#/forward-auth/bench#" \
    "$repo/examples/nginx/tollgate.conf" >"$dir/tollgate.conf"
  [ "$1" != alone ] || sed -i '/^        auth_request \/_tollgate;$/d' "$dir/tollgate.conf"
  cat >"$dir/nginx.conf" <<EOF
pid $dir/nginx.pid;
worker_processes auto;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $dir/temp;
  proxy_temp_path $dir/temp;
  include $dir/tollgate.conf;
}
EOF
  nginx -p "$dir" -e "$dir/error.log" -c "$dir/nginx.conf" -g 'daemon off;' &
  pids+=("$!")
  echo "$!" >"$dir.pid"
}
# Caddy set-up NAME asking the backend on port TOLLGATE (none for `alone`).
caddy_setup() { # name tollgate-port
  local name="caddy-$1" dir="$work/caddy-$1"
  port[$name]="$(free_port)"
  mkdir -p "$dir"
  sed -e "s/127.0.0.1:8080/127.0.0.1:$2/; s/127.0.0.1:9000/127.0.0.1:$app_port/" \
    -e "s#http://:8000#http://:${port[$name]}#; s/8099/$(free_port)/g; s#/forward-auth/api#/forward-auth/bench#" \
    "$repo/examples/caddy/Caddyfile" >"$dir/Caddyfile"
  if [ "$1" = alone ]; then
    python3 - "$dir/Caddyfile" <<'EOF'
import re, sys
path = sys.argv[1]
text = open(path).read()
open(path, "w").write(re.sub(r"\n\tforward_auth [^{]*\{.*?\n\t\}\n", "\n", text, flags=re.S))
EOF
  fi
  HOME="$dir" XDG_CONFIG_HOME="$dir" XDG_DATA_HOME="$dir" caddy run --adapter caddyfile --config "$dir/Caddyfile" \
    >"$dir/log" 2>&1 &
  pids+=("$!")
  echo "$!" >"$dir.pid"
}
for proxy in nginx caddy; do
  "${proxy}_setup" alone 9
  for name in noop embedded redis; do "${proxy}_setup" "$name" "${http[$name]}"; done
done
sleep 2

# CPU ticks (user + system) of a process and its children.
ticks() {
  local total=0 pid
  for pid in "$1" $(pgrep -P "$1" || true); do
    total=$((total + $(awk '{print $14 + $15}' "/proc/$pid/stat")))
  done
  echo "$total"
}
hz="$(getconf CLK_TCK)"
redis_pid="$(redis-cli -p "$redis_port" info server | awk -F: '/^process_id:/ {print $2}' | tr -d '\r')"

turn() { # proxy mode connections
  local proxy="$1" mode="$2" connections="$3" threads=2 target backend_pid="" out
  [ "$connections" -gt 1 ] || threads=1
  target="http://127.0.0.1:${port[$proxy-$mode]}/"
  [ "$mode" = alone ] || backend_pid="$(cat "$work/$mode.pid")"
  wrk -t1 -c8 -d1s -s "$work/user.lua" "$target" >/dev/null
  local proxy_before backend_before=0 redis_before
  proxy_before="$(ticks "$(cat "$work/$proxy-$mode.pid")")"
  [ -z "$backend_pid" ] || backend_before="$(ticks "$backend_pid")"
  redis_before="$(ticks "$redis_pid")"
  out="$(wrk -t"$threads" -c"$connections" -d"$duration" --latency -s "$work/user.lua" "$target")"
  local proxy_after backend_after=0 redis_after
  proxy_after="$(ticks "$(cat "$work/$proxy-$mode.pid")")"
  [ -z "$backend_pid" ] || backend_after="$(ticks "$backend_pid")"
  redis_after="$(ticks "$redis_pid")"
  python3 - "$proxy" "$mode" "$connections" "$hz" "$proxy_before" "$proxy_after" "$backend_before" \
    "$backend_after" "$redis_before" "$redis_after" "$out" <<'EOF'
import re, sys
proxy, mode, connections, hz, pb, pa, bb, ba, rb, ra, out = sys.argv[1:]
requests = int(re.search(r"(\d+) requests in", out).group(1))
rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
def pct(p):
    m = re.search(rf"\s{p}%\s+([\d.]+)(us|ms|s)\b", out)
    value, unit = float(m.group(1)), m.group(2)
    return value * {"us": 1, "ms": 1e3, "s": 1e6}[unit]
bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
def cpu(a, b):
    return (int(b) - int(a)) / int(hz) * 1e6 / max(requests, 1)
extra = f"  Redis {cpu(rb, ra):5.1f}" if mode == "redis" else ""
refused = f"  NON-2xx {bad.group(1)}" if bad else ""
print(f"{proxy:5} {mode:8} {connections:>3} in flight: {rate:>8.0f} req/s  p50 {pct(50):7.0f}µs  p99 {pct(99):7.0f}µs"
      f"  CPU µs/request: proxy {cpu(pb, pa):6.1f}  backend {cpu(bb, ba):5.1f}{extra}{refused}")
EOF
}

for round in $(seq "$rounds"); do
  echo "== round $round"
  for proxy in nginx caddy; do
    for mode in alone noop embedded redis; do turn "$proxy" "$mode" 64; done
    for mode in alone noop embedded redis; do turn "$proxy" "$mode" 1; done
  done
done
