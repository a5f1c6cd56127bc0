#!/usr/bin/env bash
# Latency at a given offered load, for capacity planning (the README's table): for the embedded store and
# for one Redis, the closed-loop maximum (64 in flight, 10,000 keys), then open-loop runs
# (`tollgate bench --rate`) at 25, 50, 75 and 90 % of it, each latency measured from its request's due
# time so queueing shows. Prints one Markdown row per run.
#
#   scripts/bench/bench-open-loop.sh [target/release/tollgate]
#
# DURATION (default 10s) per run. The load generator, the server and Redis share this host's cores, so
# the figures are for this host only. Needs redis-server, redis-cli and python3 on PATH.
set -euo pipefail
binary="${1:-$("$(dirname "$0")/../binary-path.sh" release)}"
duration="${DURATION:-10s}"
# shellcheck source=scripts/bench/bench-lib.sh
source "$(dirname "$0")/bench-lib.sh"

# One bench run's output as a Markdown row: store, load, offered/s, answered/s, p50, p99, p99.9, errors,
# unsent.
row() { # store load offered
  python3 -c '
import re, sys
store, load, offered, text = sys.argv[1], sys.argv[2], sys.argv[3], sys.stdin.read()
rate = re.search(r"\(([0-9]+) decisions/s\)", text).group(1)
lat = dict(re.findall(r"(p50|p99|p99\.9) ([0-9.]+[µm]?s)", text))
unsent = re.search(r"unsent ([0-9]+)", text)
errors = re.search(r"errors:? +([0-9]+)", text).group(1)
cells = [store, load, offered, rate, lat["p50"], lat["p99"], lat["p99.9"], errors, unsent.group(1) if unsent else "-"]
print("| " + " | ".join(cells) + " |")
' "$@"
}

echo "| store | load | offered/s | answered/s | p50 | p99 | p99.9 | errors | unsent |"
echo "|---|---|---|---|---|---|---|---|---|"
for store in embedded redis; do
  port="$(free_port)"
  redis-cli -p "$redis_port" flushall >/dev/null
  redis_url=""
  [ "$store" = redis ] && redis_url="127.0.0.1:$redis_port"
  REDIS_URL="$redis_url" "$binary" serve --config-dir "$work/rules" --grpc-addr "127.0.0.1:$port" \
    --http-addr "127.0.0.1:$(free_port)" --debug-addr "127.0.0.1:$(free_port)" >"$work/server.log" 2>&1 &
  server=$!
  wait_ready "$binary" "$port"
  addr="http://127.0.0.1:$port"
  closed="$(measure "$binary" "$addr")"
  max="$(sed -E 's/.*\(([0-9]+) decisions\/s\).*/\1/' <<<"$closed")"
  row "$store" "closed loop, 64 in flight" "-" <<<"$closed"
  for percent in 25 50 75 90; do
    rate=$((max * percent / 100))
    # Up to 512 in flight: a server falling behind shows as latency, not as requests never sent.
    "$binary" bench --addr "$addr" --domain bench -d 'user=u-{i}' --keys 10000 --concurrency 512 \
      --rate "$rate" --duration "$duration" 2>&1 | row "$store" "$percent %" "$rate"
  done
  stop_server
done
