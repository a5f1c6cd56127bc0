#!/usr/bin/env bash
# Instructions Redis executes inside FCALL per scripted item, algorithm by algorithm: the same calls as
# `cargo bench --bench redis_script` (16 items a call, keys whose state lives between hits), counted by
# callgrind on a redis-server of the bench's own. Unlike time, the count does not move with the host's
# load (two runs agree within 0.1 %), so it shows what a change to lua/ is worth even on a busy machine.
#
#   scripts/bench/bench-redis-script-instructions.sh [algorithm ...]
#
# `sliding_log_long` runs the sliding log on few keys, its logs going from 100 to 200 entries in the
# measured round. `floor` is a function with no logic at all that reads its keys with one MGET and writes each with
# SET ... PXAT: what any script deciding from a stored state costs Redis at least.
#
# Each algorithm runs twice, under a fresh server each time: the warm-up alone, then the warm-up and one
# measured round; the difference over the round's items is the figure (only FCALL is counted:
# --toggle-collect=fcallCommand). Needs valgrind, redis-server and cargo; takes about 10 s an algorithm.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 2; }
calls="${CALLS:-300}"
algorithms=("$@")
[ "${#algorithms[@]}" -gt 0 ] || algorithms=(fixed_window sliding_window sliding_log token_bucket gcra sliding_log_long floor)
bench="$(cargo bench --locked --bench redis_script --no-run 2>&1 \
  | sed -n 's/.*Executable benches\/redis_script.rs (\(.*\))/\1/p')"
[ -x "$bench" ] || { echo "could not build the redis_script bench" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Instructions counted inside FCALL by a run of the bench with ROUNDS measured rounds.
count() { # algorithm rounds
  local out="$work/callgrind.$1.$2"
  TOLLGATE_BENCH_REDIS_WRAPPER="valgrind --tool=callgrind --toggle-collect=fcallCommand --callgrind-out-file=$out" \
    TOLLGATE_BENCH_CALLS="$calls" TOLLGATE_BENCH_ROUNDS="$2" "$bench" "$1" >/dev/null
  sed -n 's/^totals: *\([0-9]*\).*/\1/p' "$out"
}

printf 'instructions inside FCALL per item (%d calls of 16 items):\n' "$calls"
for algorithm in "${algorithms[@]}"; do
  warm="$(count "$algorithm" 0)"
  measured="$(count "$algorithm" 1)"
  printf '  %-15s %d\n' "$algorithm" "$(( (measured - warm) / (calls * 16) ))"
done
