#!/usr/bin/env bash
# Tests the Node.js client against a real Tollgate: installs the locked dependencies (npm ci), packs
# the package as npm would publish it (npm pack, which builds dist/), installs that tarball into a fresh
# directory, then runs the tests (npm test), whose fixtures start `$TOLLGATE_BIN serve` (default: the
# debug build cargo made, in its target directory: scripts/binary-path.sh) on free loopback ports, with
# the embedded store and with a redis-server of their own. Arguments go to `node --test`, e.g.
# --test-name-pattern=lease.
#
# Node.js, npm, openssl (for the TLS tests' certificates) and redis-server come from Debian's packages
# when missing; npm's cache (~/.npm) keeps the registry downloads between runs.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

missing=()
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing ${missing[*]} (Debian packages)"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

cd "$here"
npm ci --no-audit --no-fund --prefer-offline --loglevel=error

# npm pack runs the build (prepack), so the tests below run against the dist/ that was packed.
packed="$(mktemp -d "${TMPDIR:-/tmp}/tollgate-node-packed.XXXXXX")"
trap 'rm -rf "$packed"' EXIT
tarball="$(npm pack --silent --pack-destination "$packed")"
(
    cd "$packed"
    echo '{ "name": "fresh-consumer", "private": true }' >package.json
    npm install --no-audit --no-fund --prefer-offline --loglevel=error "./$tarball"
)

TOLLGATE_BIN="$(realpath -m "${TOLLGATE_BIN:-$("$repo/scripts/binary-path.sh" debug)}")"
[ -x "$TOLLGATE_BIN" ] || { echo "no tollgate binary at $TOLLGATE_BIN: build it (cargo build) or set TOLLGATE_BIN" >&2; exit 1; }
export TOLLGATE_BIN TOLLGATE_NODE_PACKED="$packed"
npm test --silent -- "$@"
