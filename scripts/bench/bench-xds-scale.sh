#!/usr/bin/env bash
# Rules at scale over xDS: the rules file bench-rules-scale.sh loads from a directory (bench-lib.sh's
# eg_rules_file, shaped as Envoy Gateway shapes its rules), pushed instead by `tollgate xds-serve` as
# one RateLimitConfig to a server with CONFIG_TYPE=GRPC_XDS_SOTW. Printed per size: the encoded push,
# the server's time from start to ready (the push received, validated, compiled and ACKed), its RSS
# once ready and 5 s later, and one request in flight on route 0.
#
#   scripts/bench/bench-xds-scale.sh BINARY [ROUTES...]     (default: 1 20000 100000)
#
# Embedded store. XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES is raised to 64 MiB: 100,000 routes are a 14 MB
# message, past gRPC's default 4 MiB (as for the Go service). Needs python3.
set -euo pipefail
binary="$1"
shift
if [ $# -gt 0 ]; then sizes=("$@"); else sizes=(1 20000 100000); fi
# shellcheck source=scripts/bench/bench-lib.sh
source "$(dirname "$0")/bench-lib.sh"

millis() { date +%s%3N; }
xds=""
cleanup_more() { [ -z "$xds" ] || kill "$xds" 2>/dev/null || true; }

printf '%-8s %-12s %-10s %-12s %-12s %s\n' routes push ready rss-ready rss-idle 'one in flight'
for routes in "${sizes[@]}"; do
  rm -rf "$work/xds-rules" && mkdir -p "$work/xds-rules"
  eg_rules_file "$routes" "$work/xds-rules/eg.yaml"
  xds_port="$(free_port)"
  "$binary" xds-serve --config-dir "$work/xds-rules" --addr "127.0.0.1:$xds_port" >"$work/xds.log" 2>&1 &
  xds=$!
  until grep -q 'tollgate xds-serve' "$work/xds.log"; do
    kill -0 "$xds" 2>/dev/null || { cat "$work/xds.log" >&2; exit 1; }
    sleep 0.1
  done
  push="$(grep -oE '[0-9]+ bytes' "$work/xds.log")"
  port="$(free_port)"
  start="$(millis)"
  CONFIG_TYPE=GRPC_XDS_SOTW CONFIG_GRPC_XDS_SERVER_URL="127.0.0.1:$xds_port" \
    XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES=67108864 \
    "$binary" serve --grpc-addr "127.0.0.1:$port" --http-addr "127.0.0.1:$(free_port)" \
    --debug-addr "127.0.0.1:$(free_port)" >"$work/server.log" 2>&1 &
  server=$!
  wait_ready "$binary" "$port" 60
  ready=$(($(millis) - start))
  rss_ready="$(awk '/VmRSS/ {print $2 " kB"}' "/proc/$server/status")"
  sleep 5
  rss_idle="$(awk '/VmRSS/ {print $2 " kB"}' "/proc/$server/status")"
  grep -q '^ACK 1' "$work/xds.log" || { echo "no ACK:" >&2; cat "$work/xds.log" >&2; exit 1; }
  latency="$("$binary" bench --addr "127.0.0.1:$port" --domain default/eg/http \
    -d 'httproute/default/route-0/rule/0/match/0=httproute/default/route-0/rule/0/match/0,rule-0-match-0=rule-0-match-0,x-user-id=u-{i}' \
    --keys 1000 --concurrency 1 --connections 1 --duration 5s 2>&1 | grep -oE 'p50 +[0-9.]+[mµu]?s +p90 +[0-9.]+[mµu]?s +p99 +[0-9.]+[mµu]?s' | tr -s ' ')"
  stop_server
  kill "$xds" && wait "$xds" 2>/dev/null || true
  xds=""
  printf '%-8s %-12s %-10s %-12s %-12s %s\n' "$routes" "$push" "${ready} ms" "$rss_ready" "$rss_idle" "$latency"
done
