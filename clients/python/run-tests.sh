#!/usr/bin/env bash
# Tests the Python client against a real Tollgate: checks that the checked-in stubs match proto/, then
# runs pytest, whose fixtures start `$TOLLGATE_BIN serve` (default: the debug build cargo made, in its
# target directory: scripts/binary-path.sh) on free loopback ports. Arguments go to pytest.
#
# The tools live in a virtualenv under ${XDG_CACHE_HOME:-~/.cache}/tollgate-tools, rebuilt when
# pyproject.toml, requirements-test.txt or the Python version change; the package itself is reinstalled
# from this directory on every run, as a wheel, so the tests see what users install.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${XDG_CACHE_HOME:-$HOME/.cache}/tollgate-tools/py-client-venv"

# Debian ships the venv module separately (python3-venv); install it the way scripts/test.sh installs
# redis-server.
if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    echo "installing python3-venv (Debian package)"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-venv
fi

key="$( (python3 --version; cat "$here/pyproject.toml" "$here/requirements-test.txt") | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$venv/.key" 2>/dev/null)" != "$key" ]; then
    echo "creating $venv"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$here/requirements-test.txt"
    echo "$key" >"$venv/.key"
fi

# --no-build-isolation builds with the pinned hatchling already in the venv, without fetching it again.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation \
    --force-reinstall "$here"
# The pinned runtime versions must satisfy the package's declared bounds.
"$venv/bin/python" -m pip check --disable-pip-version-check
"$venv/bin/python" "$here/generate.py" --check

TOLLGATE_BIN="$(realpath -m "${TOLLGATE_BIN:-$("$repo/scripts/binary-path.sh" debug)}")"
export TOLLGATE_BIN
cd "$here"
"$venv/bin/python" -m pytest "$@"
