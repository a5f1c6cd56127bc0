#!/usr/bin/env bash
# A Redis outage as an operator sees it (docs/operations.md, "Health"): a real `tollgate serve` on a real
# `redis-server`, Redis killed for DOWN seconds (default 35) and restarted, the probes and one decision
# polled every 200 ms, with REDIS_HEALTH_CHECK_ACTIVE_CONNECTION off and on. Prints a Markdown table.
#
#   scripts/outage-timeline.sh [path/to/tollgate]      (default: the release build)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
binary="${1:-$("$here/binary-path.sh" release)}"
[ -x "$binary" ] || { echo "build first: cargo build --release --locked" >&2; exit 1; }
exec python3 "$here/outage_timeline.py" "$binary"
