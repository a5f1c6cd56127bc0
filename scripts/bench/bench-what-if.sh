#!/usr/bin/env bash
# How fast `tollgate what-if` replays: 2,000,000 lines of each input format, written by this script,
# replayed against two rule sets on one core, each run timed by /usr/bin/time (seconds, peak memory):
#   decisions  Tollgate's decision log, examples/config/api.yaml's rules (sliding window per client
#              address, IPv6 /64 grouping) against the same with 100 instead of 300 a minute;
#   decisions  the same log shape with a token bucket per user, 10,000 users;
#   nginx      NGINX's combined format, api.yaml's rules (its proxy: block makes the descriptors);
#   json       the same requests as JSON lines (NGINX's escape=json field names).
#
#   scripts/bench/bench-what-if.sh target/release/tollgate
#
# LINES (default 2000000) sets the size; RUNS (default 2) the runs of each. Needs python3.
set -euo pipefail
binary="$(realpath "$1")"
lines="${LINES:-2000000}"
runs="${RUNS:-2}"
repo="$(cd "$(dirname "$0")/../.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

mkdir -p "$work/api/current" "$work/api/proposed" "$work/bucket/current" "$work/bucket/proposed"
cp "$repo/examples/config/api.yaml" "$work/api/current/"
sed 's/requests_per_unit: 300/requests_per_unit: 100/' "$repo/examples/config/api.yaml" >"$work/api/proposed/api.yaml"
for side in current:600 proposed:300; do
  printf 'domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: %s, algorithm: token_bucket}\n' \
    "${side#*:}" >"$work/bucket/${side%%:*}/bench.yaml"
done

python3 - "$work" "$lines" <<'EOF'
import datetime, json, sys
work, lines = sys.argv[1], int(sys.argv[2])
start = 1796472000
utc = datetime.timezone.utc
with open(f"{work}/api.jsonl", "w") as api, open(f"{work}/bucket.jsonl", "w") as bucket, \
        open(f"{work}/nginx.log", "w") as nginx, open(f"{work}/json.log", "w") as js:
    for i in range(lines):
        t = start + i * 0.0005
        iso = datetime.datetime.fromtimestamp(t, utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        local = datetime.datetime.fromtimestamp(int(t), utc).strftime("%d/%b/%Y:%H:%M:%S +0000")
        # 20,000 clients taking turns (one in eight an IPv6 host, grouped by its /64), and every
        # 16th request from one of 10 heavy clients, 750 a minute each: refused under both rule sets.
        # None in 10.0.0.0/8, which api.yaml leaves unlimited.
        c = (i * 7919) % 20000
        if i % 16 == 0:
            ip = "100.127.255.%d" % (i // 16 % 10 + 1)
        elif i % 8 == 4:
            ip = "2001:db8:%x:%x::%x" % (c % 64, c // 64, i % 1000 + 1)
        else:
            ip = "100.64.%d.%d" % (c // 250, c % 250)
        api.write('{"time":"%s","domain":"api","descriptors":[{"entries":[{"key":"remote_address","value":"%s"}]}]}\n' % (iso, ip))
        bucket.write('{"time":"%s","domain":"bench","descriptors":[{"entries":[{"key":"user","value":"u-%d"}]}]}\n' % (iso, (i * 7919) % 10000))
        nginx.write('%s - - [%s] "GET /orders?page=%d HTTP/1.1" 200 612 "-" "curl/8.1"\n' % (ip, local, i % 5))
        js.write(json.dumps({"time_local": local, "remote_addr": ip, "request_method": "GET",
                             "request_uri": "/orders?page=%d" % (i % 5), "status": 200}) + "\n")
EOF

replay() { # label rules format log [more options]
  local label="$1" rules="$2" format="$3" log="$4"
  shift 4
  for run in $(seq "$runs"); do
    /usr/bin/time -f "%e %M" -o "$work/time" "$binary" what-if --current "$rules/current" \
      --proposed "$rules/proposed" --format "$format" "$@" "$log" >/dev/null
    read -r seconds kb <"$work/time"
    python3 -c "import sys; s=float(sys.argv[2]); print(f'{sys.argv[1]:32} run {sys.argv[4]}: {s:6.2f} s  {int(sys.argv[3])/s:9.0f} lines/s  peak {int(sys.argv[5])/1024:6.1f} MB')" \
      "$label" "$seconds" "$lines" "$run" "$kb"
  done
}
replay "decisions, api.yaml" "$work/api" decisions "$work/api.jsonl"
replay "decisions, token bucket per user" "$work/bucket" decisions "$work/bucket.jsonl"
replay "nginx combined, api.yaml" "$work/api" nginx "$work/nginx.log" --domain api
replay "json lines, api.yaml" "$work/api" json "$work/json.log" --domain api
