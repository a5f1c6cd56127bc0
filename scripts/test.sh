#!/usr/bin/env bash
# The project's test command (README "Running the tests"): builds with the committed lockfile and runs
# every test. Works on a fresh Debian machine with a Rust toolchain; installs what the tests need.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --locked --all-targets
cargo test --locked
