#!/usr/bin/env bash
# Whether a reload stalls decisions: one request in flight for 12 s against a server holding ROUTES
# (default 100,000) Envoy Gateway-shaped routes, ROUNDS (default 2) times without a reload and with the
# rules file changed 3 s in (the reload reads, compiles and swaps the whole set). Compare p99 and max.
#
#   scripts/bench/bench-reload-stall.sh BINARY
#
# Embedded store. Needs python3.
set -euo pipefail
binary="$1"
routes="${ROUTES:-100000}"
rounds="${ROUNDS:-2}"
# shellcheck source=scripts/bench/bench-lib.sh
source "$(dirname "$0")/bench-lib.sh"

rm -rf "$work/rules" && mkdir -p "$work/rules"
eg_rules_file "$routes" "$work/rules/eg.yaml"
port="$(free_port)"
"$binary" serve --config-dir "$work/rules" --grpc-addr "127.0.0.1:$port" --http-addr "127.0.0.1:$(free_port)" \
  --debug-addr "127.0.0.1:$(free_port)" >"$work/server.log" 2>&1 &
server=$!
wait_ready "$binary" "$port" 60
sleep 5
route='httproute/default/route-0/rule/0/match/0'
one_in_flight() {
  "$binary" bench --addr "127.0.0.1:$port" --domain default/eg/http \
    -d "$route=$route,rule-0-match-0=rule-0-match-0,x-user-id=u-{i}" --keys 1000 --concurrency 1 \
    --connections 1 --duration 12s 2>&1 | grep latency | tr -s ' '
}
for round in $(seq "$rounds"); do
  printf 'no reload: %s\n' "$(one_in_flight)"
  (sleep 3 && echo "# changed $round" >>"$work/rules/eg.yaml") &
  printf 'reload:    %s\n' "$(one_in_flight)"
done
stop_server
