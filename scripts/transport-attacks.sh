#!/usr/bin/env bash
# Performs the transport attacks of issue #30 against a release build and prints what each costs
# (memory, descriptors, /healthcheck and decision latency during the attack); exits non-zero if a
# bound did not hold. Needs python3 and the `h2` package, installed into a virtualenv in ~/.cache.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --quiet
venv="${XDG_CACHE_HOME:-$HOME/.cache}/tollgate-tools/attack-venv"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet 'h2==4.*'
fi
exec "$venv/bin/python" scripts/transport_attacks.py --binary "$(scripts/binary-path.sh release)" "$@"
