#!/usr/bin/env bash
# Rules at scale: for each number of routes, a rules file shaped as Envoy Gateway shapes its rules
# (bench-lib.sh's eg_rules_file: one domain, one top-level descriptor per route rule, a client selector
# below it: three levels) is loaded by `check-config` and by a server. Printed per size: the file's
# size, check-config's wall time, the server's time from start to ready, its RSS once ready, 5 s later
# (the allocator has by then returned what parsing left) and after a decision on every route (which
# adds a stored counter and the route's series), the series in one scrape of /metrics, and one request
# in flight on route 0.
#
#   scripts/bench/bench-rules-scale.sh BINARY [ROUTES...]     (default: 1 8000 20000 100000)
#
# Embedded store. Needs python3 and curl.
set -euo pipefail
binary="$1"
shift
if [ $# -gt 0 ]; then sizes=("$@"); else sizes=(1 8000 20000 100000); fi
# shellcheck source=scripts/bench/bench-lib.sh
source "$(dirname "$0")/bench-lib.sh"

millis() { date +%s%3N; }

printf '%-8s %-10s %-12s %-12s %-12s %-12s %-14s %-9s %s\n' routes file check-config ready rss-ready rss-idle rss-all-hit series 'one in flight'
for routes in "${sizes[@]}"; do
  rm -rf "$work/rules" && mkdir -p "$work/rules"
  eg_rules_file "$routes" "$work/rules/eg.yaml"
  size="$(du -h "$work/rules/eg.yaml" | cut -f1)"
  start="$(millis)"
  "$binary" check-config "$work/rules" >/dev/null || echo "check-config refused the rules: $("$binary" check-config "$work/rules" 2>&1 | tail -1)" >&2
  check=$(($(millis) - start))
  port="$(free_port)" http="$(free_port)"
  start="$(millis)"
  "$binary" serve --config-dir "$work/rules" --grpc-addr "127.0.0.1:$port" --http-addr "127.0.0.1:$http" \
    --debug-addr "127.0.0.1:$(free_port)" >"$work/server.log" 2>&1 &
  server=$!
  wait_ready "$binary" "$port"
  ready=$(($(millis) - start))
  rss_ready="$(awk '/VmRSS/ {print $2 " kB"}' "/proc/$server/status")"
  sleep 5
  rss_idle="$(awk '/VmRSS/ {print $2 " kB"}' "/proc/$server/status")"
  latency="$("$binary" bench --addr "127.0.0.1:$port" --domain default/eg/http \
    -d 'httproute/default/route-0/rule/0/match/0=httproute/default/route-0/rule/0/match/0,rule-0-match-0=rule-0-match-0,x-user-id=u-{i}' \
    --keys 1000 --concurrency 1 --connections 1 --duration 5s 2>&1 | grep -oE 'p50 +[0-9.]+[mµu]?s +p90 +[0-9.]+[mµu]?s +p99 +[0-9.]+[mµu]?s' | tr -s ' ')"
  "$binary" bench --addr "127.0.0.1:$port" --domain default/eg/http \
    -d 'httproute/default/route-{i}/rule/0/match/0=httproute/default/route-{i}/rule/0/match/0,rule-0-match-0=rule-0-match-0,x-user-id=u' \
    --keys "$routes" --concurrency 16 --duration 3s >/dev/null 2>&1
  rss_hit="$(awk '/VmRSS/ {print $2 " kB"}' "/proc/$server/status")"
  series="$(curl -s "http://127.0.0.1:$http/metrics" | grep -vc '^#')"
  stop_server
  printf '%-8s %-10s %-12s %-12s %-12s %-12s %-14s %-9s %s\n' "$routes" "$size" "${check} ms" "${ready} ms" \
    "$rss_ready" "$rss_idle" "$rss_hit" "$series" "$latency"
done
