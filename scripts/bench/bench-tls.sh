#!/usr/bin/env bash
# The cost of TLS on the gRPC listener: `tollgate bench` (64 in flight over 4 connections, 10,000 keys,
# DURATION, default 10s) against a plaintext, a TLS and an mTLS listener, in alternating turns, on the
# embedded store (where the listener's share of the CPU is largest) and on one Redis.
#
#   scripts/bench/bench-tls.sh target/release/tollgate
#
# Certificates (ECDSA P-256, as cert-manager issues by default) are made with openssl for the run.
# ROUNDS (default 2) rounds; only ratios within one run mean much on a shared 2-core host. Needs
# openssl, redis-server, redis-cli and python3 on PATH.
set -euo pipefail
binary="$1"
rounds="${ROUNDS:-2}"
duration="${DURATION:-10s}"
# shellcheck source=scripts/bench/bench-lib.sh
source "$(dirname "$0")/bench-lib.sh"

cert() { # name extended-key-usage
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$1" \
    -keyout "$work/$1.key" -out "$work/$1.csr" 2>/dev/null
  printf 'subjectAltName=DNS:localhost\nextendedKeyUsage=%s\n' "$2" > "$work/$1.ext"
  openssl x509 -req -in "$work/$1.csr" -CA "$work/ca.crt" -CAkey "$work/ca.key" -CAcreateserial \
    -days 1 -extfile "$work/$1.ext" -out "$work/$1.crt" 2>/dev/null
}
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=bench CA" -days 1 \
  -keyout "$work/ca.key" -out "$work/ca.crt" 2>/dev/null
cert server serverAuth
cert client clientAuth

# Waits (up to 10 s) for /healthcheck on HTTP PORT (gRPC may be TLS, which `tollgate healthcheck` is not).
wait_http() {
  python3 - "$1" <<'PY'
import sys, time, urllib.request
for _ in range(100):
    try:
        if urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/healthcheck", timeout=0.2).status == 200:
            sys.exit(0)
    except Exception:
        time.sleep(0.1)
sys.exit("the server never became ready")
PY
}

turn() { # mode store
  local mode="$1" store="$2" port http scheme=http
  port="$(free_port)"
  http="$(free_port)"
  redis-cli -p "$redis_port" flushall >/dev/null
  local redis_url="" env=() client=()
  [ "$store" = redis ] && redis_url="127.0.0.1:$redis_port"
  if [ "$mode" != plain ]; then
    scheme=https
    env=(GRPC_SERVER_USE_TLS=true GRPC_SERVER_TLS_CERT="$work/server.crt" GRPC_SERVER_TLS_KEY="$work/server.key")
    client=(--tls-ca "$work/ca.crt" --tls-domain localhost)
  fi
  if [ "$mode" = mtls ]; then
    env+=(GRPC_CLIENT_TLS_CACERT="$work/ca.crt")
    client+=(--tls-cert "$work/client.crt" --tls-key "$work/client.key")
  fi
  env REDIS_URL="$redis_url" "${env[@]}" "$binary" serve --config-dir "$work/rules" \
    --grpc-addr "127.0.0.1:$port" --http-addr "127.0.0.1:$http" --debug-addr "127.0.0.1:$(free_port)" \
    >"$work/server.log" 2>&1 &
  server=$!
  wait_http "$http"
  printf '%-6s %-7s ' "$mode" "$store"
  measure "$binary" "$scheme://127.0.0.1:$port" "${client[@]}"
  stop_server
}

for round in $(seq "$rounds"); do
  for store in memory redis; do
    for mode in plain tls mtls; do
      turn "$mode" "$store"
    done
  done
done
