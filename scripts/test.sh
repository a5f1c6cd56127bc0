#!/usr/bin/env bash
# The project's test command (README "Running the tests"): installs what the tests need on a fresh
# Debian machine (redis-server and redis-cli, from Debian's packages), builds with the committed lockfile
# and runs every test. Redis tests start their own servers on free loopback ports; with
# TOLLGATE_REQUIRE_REDIS=1 a missing redis-server fails them instead of skipping them.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    echo "installing redis-server and redis-tools (Debian packages)"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends redis-server redis-tools
fi
export TOLLGATE_REQUIRE_REDIS=1

cargo build --locked --all-targets --all-features
cargo test --locked --all-features
# The same wire-level test bodies again, every server backed by its own real redis-server.
TOLLGATE_TEST_STORE=redis cargo test --locked --all-features --test it -- grpc:: headers:: hostile_input:: json_endpoint:: native:: reload::
# And once more with the rules pushed over xDS by a management server in the test process, wherever a
# test's rules have an xDS form (envoyproxy/ratelimit's fields only; see tests/it/common/xds_rules.rs).
TOLLGATE_TEST_RULES=xds cargo test --locked --all-features --test it -- grpc:: headers:: hostile_input:: json_endpoint:: native::
# The Python client (clients/python) against the debug binary built above: its checked-in stubs must
# match proto/, then its tests start real servers (a virtualenv with pinned tools, kept in ~/.cache).
clients/python/run-tests.sh -q -p no:cacheprovider
