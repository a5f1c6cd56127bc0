#!/usr/bin/env bash
# What the application clients cost: the Node.js client against a bare @grpc/grpc-js call of the same
# RPC, and the Python asyncio client, at 64 calls in flight on one channel, against `tollgate noop-serve`
# (Envoy's ShouldRateLimit answered without deciding: the transport and the client alone) and against
# Tollgate on the embedded store (tollgate.v1 Check and ShouldRateLimit). Turns alternate within each
# round; every turn prints decisions/s, p50, p99 and the client process's CPU per call
# (clients/node/bench/closed-loop.mjs and clients/python/bench/closed_loop.py measure them), and the end
# prints each call's medians and the Node client's p50 and CPU over the bare call's.
#
#   scripts/bench/bench-clients.sh target/release/tollgate
#
# ROUNDS (default 3) rounds of DURATION (default 10) seconds per turn. Needs the Node package's
# dependencies and build (cd clients/node && npm ci && npm run build) and the Python client's virtualenv
# (clients/python/run-tests.sh makes it; PYTHON overrides it). noop-serve has no native API, so the
# Python client (which has no Envoy call) is measured against the embedded store only.
set -euo pipefail
binary="$(realpath "$1")"
rounds="${ROUNDS:-3}"
duration="${DURATION:-10}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
python="${PYTHON:-${XDG_CACHE_HOME:-$HOME/.cache}/tollgate-tools/py-client-venv/bin/python}"
pids=()
cleanup_more() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
# shellcheck source=scripts/bench/bench-lib.sh
source "$root/scripts/bench/bench-lib.sh"

[ -f "$root/clients/node/dist/esm/index.js" ] || { echo "build the Node package first (npm ci && npm run build in clients/node)" >&2; exit 1; }
[ -x "$python" ] || { echo "no Python client virtualenv at $python: run clients/python/run-tests.sh once" >&2; exit 1; }

noop_port="$(free_port)"
"$binary" noop-serve --grpc-addr "127.0.0.1:$noop_port" >"$work/noop.log" 2>&1 &
pids+=("$!")
embedded_port="$(free_port)"
"$binary" serve --config-dir "$work/rules" --grpc-addr "127.0.0.1:$embedded_port" \
  --http-addr "127.0.0.1:$(free_port)" --debug-addr "127.0.0.1:$(free_port)" >"$work/embedded.log" 2>&1 &
pids+=("$!")
wait_ready "$binary" "$embedded_port"
until "$binary" bench --addr "http://127.0.0.1:$noop_port" --domain bench -d 'user=x' --concurrency 1 \
  --duration 100ms >/dev/null 2>&1; do sleep 0.1; done

turn() { # server port call
  local server="$1" port="$2" call="$3" line
  if [ "$call" = python-aio-check ]; then
    line="$("$python" "$root/clients/python/bench/closed_loop.py" --target "127.0.0.1:$port" --duration "$duration")"
  else
    line="$(node "$root/clients/node/bench/closed-loop.mjs" --target "127.0.0.1:$port" --call "$call" --duration "$duration")"
  fi
  echo "{\"server\": \"$server\", ${line#\{}" | tee -a "$work/turns.jsonl"
}

for round in $(seq "$rounds"); do
  echo "== round $round"
  turn noop "$noop_port" bare-envoy
  turn noop "$noop_port" client-envoy
  turn embedded "$embedded_port" bare-check
  turn embedded "$embedded_port" client-check
  turn embedded "$embedded_port" python-aio-check
  turn embedded "$embedded_port" bare-envoy
  turn embedded "$embedded_port" client-envoy
done

python3 - "$work/turns.jsonl" <<'EOF'
import json, statistics, sys
turns = [json.loads(line) for line in open(sys.argv[1])]
FIELDS = ("decisions_per_s", "p50_ms", "p99_ms", "client_cpu_us")
print("\nmedians over the rounds (decisions/s, p50 ms, p99 ms, the client process's CPU µs per call, errors):")
for key in dict.fromkeys((t["server"], t["call"]) for t in turns):
    mine = [t for t in turns if (t["server"], t["call"]) == key]
    m = {f: statistics.median(t[f] for t in mine) for f in FIELDS}
    print(f"  {key[0]:9} {key[1]:17} {m['decisions_per_s']:>8.0f}/s  p50 {m['p50_ms']:7.3f}  p99 {m['p99_ms']:7.3f}"
          f"  CPU {m['client_cpu_us']:6.1f}  errors {sum(t['errors'] for t in mine)}")
print("\nthe Node client over the bare grpc-js call, p50 and CPU per call (median of the rounds' ratios):")
for server, client, bare in (("noop", "client-envoy", "bare-envoy"), ("embedded", "client-check", "bare-check"),
                             ("embedded", "client-envoy", "bare-envoy")):
    pairs = list(zip([t for t in turns if (t["server"], t["call"]) == (server, client)],
                     [t for t in turns if (t["server"], t["call"]) == (server, bare)]))
    for field in ("p50_ms", "client_cpu_us"):
        ratios = [c[field] / b[field] for c, b in pairs]
        print(f"  {server:9} {client:13} {field:13} {statistics.median(ratios):.3f}"
              f"  (rounds: {', '.join(f'{r:.3f}' for r in ratios)})")
EOF
