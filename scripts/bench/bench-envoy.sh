#!/usr/bin/env bash
# What Tollgate costs a request that goes through Envoy. Four Envoys (the pinned Envoy of
# scripts/install-envoy.sh, one worker each) serve the same route to the same upstream (a
# `direct_response` listener of their own, on a unix socket):
#   alone      no rate limit filter;
#   noop       the filter asking `tollgate noop-serve` (answers OK, decides nothing);
#   embedded   the filter asking Tollgate on the embedded store;
#   redis      the filter asking Tollgate on Redis.
# wrk sends GET / with one of 10,000 x-user values, which Envoy turns into the descriptor (user) of
# bench-lib's rules (a token bucket no load reaches), at 64 connections in flight and at one. Every
# process runs for the whole measurement and the turns alternate, ROUNDS (default 2) rounds of DURATION
# (default 10s) turns. Each turn prints requests/s, p50 and p99, and the CPU per request (user + system
# from /proc) of Envoy, of the server it asks and of Redis; then Redis's own PING round trip; then the
# ratios against `noop` the goals are stated in, from the medians over the rounds.
#
#   flock /tmp/tollgate-bench.lock scripts/bench/bench-envoy.sh target/release/tollgate
#
# Needs wrk (Debian's package), redis-server, redis-cli, redis-benchmark and python3 on PATH.
set -euo pipefail
binary="$1"
rounds="${ROUNDS:-2}"
duration="${DURATION:-10s}"
here="$(cd "$(dirname "$0")" && pwd)"
envoy="$("$here/../install-envoy.sh")"
command -v wrk >/dev/null || { echo "bench-envoy.sh: wrk is not installed (apt-get install wrk)" >&2; exit 1; }
# shellcheck source=scripts/bench/bench-lib.sh
source "$here/bench-lib.sh"
start_floor_servers "$binary"

# One Envoy per setup: its bootstrap, then the process, ready when its admin says LIVE.
declare -A listen envoy_pid
for name in alone noop embedded redis; do
  listen[$name]="$(free_port)"
  python3 - "$name" "${listen[$name]}" "${port[$name]:-0}" "$work/$name" >"$work/$name-envoy.json" <<'EOF'
import json, sys
name, listen, rls, base = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
hcm = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
router = {"name": "envoy.filters.http.router",
          "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}
def listener(lname, address, filters, route):
    return {"name": lname, "address": address, "filter_chains": [{"filters": [{
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {"@type": hcm, "stat_prefix": lname, "http_filters": filters + [router],
                         "route_config": {"virtual_hosts": [{"name": lname, "domains": ["*"], "routes": [route]}]}}}]}]}
upstream = {"pipe": {"path": f"{base}-upstream.sock"}}
route = {"match": {"prefix": "/"}, "route": {"cluster": "app", "rate_limits": [
    {"actions": [{"request_headers": {"header_name": "x-user", "descriptor_key": "user"}}]}]}}
filters, clusters = [], [{"name": "app", "type": "STATIC", "connect_timeout": "1s", "load_assignment": {
    "cluster_name": "app", "endpoints": [{"lb_endpoints": [{"endpoint": {"address": upstream}}]}]}}]
if name != "alone":
    filters.append({"name": "envoy.filters.http.ratelimit", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
        "domain": "bench", "timeout": "1s", "failure_mode_deny": True,
        "rate_limit_service": {"grpc_service": {"envoy_grpc": {"cluster_name": "tollgate"}},
                               "transport_api_version": "V3"}}})
    clusters.append({"name": "tollgate", "type": "STATIC", "connect_timeout": "1s",
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}}},
        "load_assignment": {"cluster_name": "tollgate", "endpoints": [{"lb_endpoints": [{"endpoint": {
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": rls}}}}]}]}})
direct = {"match": {"prefix": "/"}, "direct_response": {"status": 200, "body": {"inline_string": "ok\n"}}}
print(json.dumps({
    "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
    "static_resources": {
        "listeners": [
            listener("ingress", {"socket_address": {"address": "127.0.0.1", "port_value": listen}}, filters, route),
            listener("upstream", upstream, [], direct),
        ],
        "clusters": clusters,
    },
}))
EOF
  "$envoy" -c "$work/$name-envoy.json" --disable-hot-restart --concurrency 1 --log-level warning \
    --admin-address-path "$work/$name-admin" >"$work/$name-envoy.log" 2>&1 &
  envoy_pid[$name]=$!
  pids+=("$!")
done
for name in alone noop embedded redis; do
  tries=100
  until [ -s "$work/$name-admin" ] && python3 -c 'import sys, urllib.request
sys.exit(urllib.request.urlopen(f"http://{sys.argv[1]}/ready").read().strip() != b"LIVE")' \
    "$(cat "$work/$name-admin")" 2>/dev/null; do
    tries=$((tries - 1))
    [ "$tries" -gt 0 ] || { echo "Envoy ($name) never became ready:" >&2; cat "$work/$name-envoy.log" >&2; exit 1; }
    sleep 0.1
  done
done

cat >"$work/users.lua" <<'EOF'
-- One of 10,000 callers per request.
request = function()
  return wrk.format(nil, "/", {["x-user"] = "u-" .. math.random(10000)})
end
EOF

results="$work/results"
# One turn: wrk through setup NAME with CONNECTIONS in flight (as many, up to 2, wrk threads).
turn() { # name connections
  local name="$1" connections="$2" threads=1 rls_pid=0 before out
  [ "$connections" -gt 1 ] && threads=2
  [ "$name" = alone ] || rls_pid="${pid[$name]}"
  local address="127.0.0.1:${listen[$name]}"
  wrk -t1 -c4 -d1s -s "$work/users.lua" "http://$address/" >/dev/null 2>&1
  before="$(ticks "${envoy_pid[$name]}") $( [ "$rls_pid" = 0 ] && echo 0 || ticks "$rls_pid") $(ticks "$redis_pid")"
  out="$(wrk -t"$threads" -c"$connections" -d"$duration" --latency -s "$work/users.lua" "http://$address/" 2>&1)"
  local after
  after="$(ticks "${envoy_pid[$name]}") $( [ "$rls_pid" = 0 ] && echo 0 || ticks "$rls_pid") $(ticks "$redis_pid")"
  python3 - "$name" "$connections" "$before" "$after" "$hz" "$out" <<'EOF' | tee -a "$results"
import re, sys
name, connections, before, after, hz, out = sys.argv[1:]
rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
total = int(re.search(r"(\d+) requests in", out).group(1))
bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
errors = re.search(r"Socket errors: (.*)", out)
def us(text):
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()
    return float(value) * {"us": 1, "ms": 1e3, "s": 1e6}[unit]
p50, p99 = (us(re.search(rf"\s{q}%\s+(\S+)", out).group(1)) for q in ("50", "99"))
cpu = [(int(b) - int(a)) / int(hz) * 1e6 / max(total, 1) for a, b in zip(before.split(), after.split())]
server = "-" if name == "alone" else f"{cpu[1]:5.1f}"
redis = f"{cpu[2]:5.1f}" if name == "redis" else "-"
flags = (f"  NON-2XX {bad.group(1)}" if bad else "") + (f"  SOCKET ERRORS {errors.group(1)}" if errors else "")
print(f"{name:9} {connections:>3} in flight: {rate:>8.0f} requests/s  p50 {p50:7.0f}µs  p99 {p99:7.0f}µs  "
      f"CPU/request µs: envoy {cpu[0]:5.1f} server {server:>5} redis {redis:>5}{flags}")
EOF
}

: >"$results"
for round in $(seq "$rounds"); do
  echo "== round $round"
  for name in alone noop embedded redis; do turn "$name" 64; done
  for name in alone noop embedded redis; do turn "$name" 1; done
  redis_ping | tee -a "$results"
done

echo "== against the goals (medians over the rounds; the goals: at one in flight Tollgate adds at most"
echo "   15 µs p50 over the no-op embedded, at most a Redis PING + 30 µs on Redis; at 64 in flight it keeps"
echo "   0.95x (embedded) and 0.85x (Redis) the no-op's requests/s)"
python3 - "$results" <<'EOF'
import re, statistics, sys
rows = {}
ping = []
for line in open(sys.argv[1]):
    m = re.match(r"(\w+)\s+(\d+) in flight:\s+(\d+) requests/s\s+p50\s+(\d+)µs", line)
    if m:
        rows.setdefault((m[1], int(m[2])), []).append((int(m[3]), int(m[4])))
    m = re.match(r"redis PING.*p50\s+(\d+)µs", line)
    if m:
        ping.append(int(m[1]))
med = lambda key, i: statistics.median(v[i] for v in rows[key])
ping_p50 = statistics.median(ping)
for name in ("embedded", "redis"):
    added = med((name, 1), 1) - med(("noop", 1), 1)
    ratio = med((name, 64), 0) / med(("noop", 64), 0)
    print(f"{name:9} 1 in flight: p50 +{added:.0f} µs over the no-op"
          + (f" (Redis PING p50 {ping_p50:.0f} µs)" if name == "redis" else "")
          + f"; 64 in flight: {ratio:.2f}x the no-op's requests/s")
through = med(("noop", 1), 1) - med(("alone", 1), 1)
print(f"the filter and a gRPC round trip to the no-op: +{through:.0f} µs p50 over Envoy alone at 1 in flight; "
      f"{med(('noop', 64), 0) / med(('alone', 64), 0):.2f}x Envoy alone's requests/s at 64")
EOF
