#!/usr/bin/env python3
"""Generates the gRPC stubs of Tollgate's native API into src/tollgate/v1/, or checks them.

    python generate.py          # rewrite the checked-in stubs from ../../proto
    python generate.py --check  # regenerate into a temporary directory; exit 1 if the stubs differ

The output depends only on the proto file and the grpcio-tools version (it embeds its own protoc), so
that version is pinned in requirements-test.txt and checked here: the same inputs give the same bytes.
"""

import argparse
import difflib
import importlib.metadata
import pathlib
import re
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
PROTO_ROOT = HERE.parents[1] / "proto"
PROTO = "tollgate/v1/ratelimiter.proto"
SOURCE_ROOT = HERE / "src"
GENERATED = ("ratelimiter_pb2.py", "ratelimiter_pb2.pyi", "ratelimiter_pb2_grpc.py")
PIN_FILE = HERE / "requirements-test.txt"


def pinned_tools_version() -> str:
    """The grpcio-tools version requirements-test.txt pins."""
    match = re.search(r"^grpcio-tools==(\S+)$", PIN_FILE.read_text(), re.MULTILINE)
    if match is None:
        sys.exit(f"{PIN_FILE} does not pin grpcio-tools (a line grpcio-tools==X.Y.Z)")
    return match.group(1)


def require_pinned_tools() -> None:
    """Exits unless the installed grpcio-tools is the pinned one: another version writes other code."""
    wanted = pinned_tools_version()
    try:
        installed = importlib.metadata.version("grpcio-tools")
    except importlib.metadata.PackageNotFoundError:
        installed = "none"
    if installed != wanted:
        sys.exit(f"generate.py needs grpcio-tools=={wanted} (installed: {installed}); "
                 f"pip install grpcio-tools=={wanted}")


def generate(out: pathlib.Path) -> None:
    """Runs protoc on the native API's proto, writing tollgate/v1/* under `out`."""
    from grpc_tools import protoc  # imported late: the version check above names the fix if it is missing

    # google/protobuf/duration.proto comes with grpcio-tools, as its runtime module comes with protobuf.
    well_known = pathlib.Path(protoc.__file__).parent / "_proto"
    args = ["protoc", f"-I{PROTO_ROOT}", f"-I{well_known}",
            f"--python_out={out}", f"--pyi_out={out}", f"--grpc_python_out={out}", PROTO]
    if protoc.main(args) != 0:
        sys.exit(f"protoc failed on {PROTO_ROOT / PROTO}")


def check() -> int:
    """Regenerates into a temporary directory and compares with the checked-in stubs."""
    checked_in = SOURCE_ROOT / "tollgate" / "v1"
    with tempfile.TemporaryDirectory(prefix="tollgate-stubs-") as temp:
        generate(pathlib.Path(temp))
        fresh = pathlib.Path(temp) / "tollgate" / "v1"
        stale = [name for name in GENERATED if not same(checked_in / name, fresh / name)]
        for name in stale:
            print(diff_summary(checked_in / name, fresh / name), file=sys.stderr)
    if stale:
        print(f"stale stubs in {checked_in}: {', '.join(stale)}; run python {HERE / 'generate.py'}",
              file=sys.stderr)
        return 1
    print(f"stubs in {checked_in} are up to date")
    return 0


def same(a: pathlib.Path, b: pathlib.Path) -> bool:
    return a.exists() and a.read_bytes() == b.read_bytes()


def diff_summary(checked_in: pathlib.Path, fresh: pathlib.Path, max_lines: int = 20) -> str:
    """The first lines of a unified diff: enough to see what changed without flooding a CI log."""
    old = checked_in.read_text().splitlines() if checked_in.exists() else []
    lines = list(difflib.unified_diff(old, fresh.read_text().splitlines(), str(checked_in), "regenerated",
                                      lineterm=""))
    shown = lines[:max_lines]
    if len(lines) > max_lines:
        shown.append(f"... {len(lines) - max_lines} more diff lines")
    return "\n".join(shown)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="fail if the checked-in stubs are stale")
    options = parser.parse_args()
    require_pinned_tools()
    if options.check:
        return check()
    generate(SOURCE_ROOT)
    print(f"wrote {', '.join(GENERATED)} in {SOURCE_ROOT / 'tollgate' / 'v1'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
