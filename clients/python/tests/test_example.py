"""examples/python/limited_app.py, run as its docstring says (its own process, Tollgate's address in
TOLLGATE_ADDR) against a real Tollgate serving examples/config: the sixth OTP in an hour gets 429 with
Retry-After, a failed export is refunded, and with Tollgate gone the OTP fails open while the export
fails closed.
"""

import os
import pathlib
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Dict, Iterator, Optional, Tuple

import pytest
from support import TollgateServer, unused_address

REPO = pathlib.Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "python" / "limited_app.py"


def post(app: str, path: str, headers: Optional[Dict[str, str]] = None) -> Tuple[int, Dict[str, str]]:
    """POSTs to the example app; returns the status and the headers (lower-cased names)."""
    request = urllib.request.Request(f"http://{app}{path}", method="POST", data=b"", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}


@pytest.fixture
def example(tollgate_bin: str) -> Iterator[Tuple[str, TollgateServer]]:
    """The example app (its address) in front of a Tollgate serving examples/config."""
    server = TollgateServer(tollgate_bin, REPO / "examples" / "config")
    port = unused_address().rsplit(":", 1)[1]
    # A patient deadline, as the Rust example's test gives its app: on a busy machine a call late by
    # more than the 25 ms default is answered by the route's failure policy (an export then gets 503,
    # not the 502 of its failed work), which is tested only once Tollgate is stopped; there each call
    # waits this long for it to come back, within the test's own 10 s.
    env = dict(os.environ, TOLLGATE_ADDR=server.grpc, APP_PORT=port, TOLLGATE_DEADLINE_MS="2000")
    app = subprocess.Popen([sys.executable, str(EXAMPLE)], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(f"http://{address}/", timeout=1):
                pass
        except urllib.error.HTTPError:
            break  # answering (404 for GET /): up
        except OSError:
            assert app.poll() is None, "the example exited"
            assert time.monotonic() < deadline, "the example never listened"
            time.sleep(0.05)
    try:
        yield address, server
    finally:
        app.kill()
        app.wait()
        server.stop()


def test_the_example_limits_otps_refunds_failed_exports_and_fails_as_each_route_chooses(example):
    app, server = example
    statuses = [post(app, "/send-otp?phone=5550100")[0] for _ in range(5)]
    assert statuses == [200] * 5
    status, headers = post(app, "/send-otp?phone=5550100")
    assert status == 429
    assert 3590 <= int(headers["retry-after"]) <= 3600
    assert "ratelimit" in headers, headers

    user = {"x-user-id": "ada"}
    assert post(app, "/export?fail=1", user)[0] == 502
    # Refunded: three more exports fit in the day, the fourth does not.
    assert [post(app, "/export", user)[0] for _ in range(4)] == [200, 200, 200, 429]

    server.stop()
    assert post(app, "/send-otp?phone=5550199")[0] == 200, "an OTP fails open"
    assert post(app, "/export", {"x-user-id": "grace"})[0] == 503, "an export fails closed"
