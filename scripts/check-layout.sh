#!/usr/bin/env bash
# The layout rules of docs/design.md that the compiler does not keep by itself, run by CI:
#   1. the core crate's dependency tree holds no transport (tonic, axum, hyper, h2, prost: no gRPC, no
#      HTTP server, no generated protocol types), with its default features and with none;
#   2. no source file passes 800 lines of code (inline test modules not counted), no two files import each other in a cycle, and each crate's
#      top-level modules import each other in one direction only (scripts/check_layout.py).
set -euo pipefail
cd "$(dirname "$0")/.."

status=0
for features in "" "--no-default-features"; do
    # shellcheck disable=SC2086 # $features is one flag or none
    transport=$(cargo tree --locked -p tollgate-core -e normal --prefix none $features \
        | grep -E '^(tonic|axum|hyper|h2|prost)[ -]' | sort -u || true)
    if [ -n "$transport" ]; then
        echo "tollgate-core ${features:-(default features)} depends on a transport crate:" >&2
        echo "$transport" >&2
        status=1
    fi
done
python3 scripts/check_layout.py || status=1
[ "$status" -eq 0 ] && echo "layout: the core has no transport; files are short and import without cycles"
exit "$status"
