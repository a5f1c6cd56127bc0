#!/usr/bin/env bash
# Prints the path of the `tollgate` binary cargo builds for a profile (`debug` by default, or `release`,
# `profiling`), in the target directory cargo itself uses: CARGO_TARGET_DIR and a `build.target-dir` in
# cargo's configuration are honoured, so scripts never assume `./target`.
#
#   scripts/binary-path.sh [profile]
set -euo pipefail
profile="${1:-debug}"
cd "$(dirname "$0")/.."
target=$(cargo metadata --no-deps --format-version 1 --locked | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
[ -n "$target" ] || { echo "binary-path.sh: cargo metadata gave no target directory" >&2; exit 1; }
echo "$target/$profile/tollgate"
