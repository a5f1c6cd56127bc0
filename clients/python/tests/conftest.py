"""Fixtures: one real Tollgate for the whole run (tests keep apart by using their own descriptor
values), and the unreachable kinds of Tollgate.
"""

import os
import pathlib
from typing import Iterator, List

import pytest
from support import PATIENT_DEADLINE, RULES, Blackhole, StartServer, TollgateServer, new_key, unused_address

import tollgate

REPO = pathlib.Path(__file__).resolve().parents[3]

@pytest.fixture(scope="session")
def tollgate_bin() -> str:
    """The server binary: $TOLLGATE_BIN, else the debug build in $CARGO_TARGET_DIR or the repository's
    target directory (run-tests.sh always sets $TOLLGATE_BIN, from cargo's own target directory)."""
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
    binary = os.environ.get("TOLLGATE_BIN") or str(target / "debug" / "tollgate")
    if not os.access(binary, os.X_OK):
        pytest.fail(f"no tollgate binary at {binary}: build it (cargo build) or set TOLLGATE_BIN")
    return binary


@pytest.fixture(scope="session")
def rules_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A directory holding the tests' rules (domain `test`, see support.RULES)."""
    directory = tmp_path_factory.mktemp("rules")
    (directory / "test.yaml").write_text(RULES)
    return directory


@pytest.fixture(scope="session")
def server(tollgate_bin: str, rules_dir: pathlib.Path) -> Iterator[TollgateServer]:
    """A Tollgate shared by every test of the run."""
    running = TollgateServer(tollgate_bin, rules_dir)
    yield running
    running.stop()


@pytest.fixture
def start_server(tollgate_bin: str, rules_dir: pathlib.Path) -> Iterator[StartServer]:
    """Starts a Tollgate of the test's own (on a given gRPC address, or to stop it mid-test); every
    server started is stopped after the test.
    """
    started: List[TollgateServer] = []

    def start(grpc_addr: str = "127.0.0.1:0") -> TollgateServer:
        started.append(TollgateServer(tollgate_bin, rules_dir, grpc_addr))
        return started[-1]

    yield start
    for running in started:
        running.stop()


@pytest.fixture
def client(server: TollgateServer) -> Iterator[tollgate.Client]:
    """A sync client of the shared server, in domain `test`."""
    with tollgate.Client(server.grpc, domain="test", deadline=PATIENT_DEADLINE) as opened:
        yield opened


@pytest.fixture
def key() -> str:
    """A descriptor value of this test's own."""
    return new_key()


@pytest.fixture
def blackhole() -> Iterator[str]:
    """The address of a listener that accepts connections and never answers."""
    listener = Blackhole()
    yield listener.address
    listener.close()


@pytest.fixture
def unused() -> str:
    """An address with nothing listening."""
    return unused_address()
