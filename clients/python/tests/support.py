"""What the tests run against: a real `tollgate serve` process, a listener that never answers, and a
port with nothing behind it.
"""

import asyncio
import functools
import os
import pathlib
import re
import socket
import subprocess
import threading
import time
import urllib.request
from typing import Any, Callable, Coroutine, List

# Generous: a debug build on a busy two-core machine can take a while to bind and load its rules.
STARTUP_TIMEOUT = 20.0

# Real-server tests must not fail open because a busy machine was slow: they get a long deadline and
# check that nothing failed open. The failure tests set their own short one.
PATIENT_DEADLINE = 5.0

# The line the server logs (at WARN, so it shows at the default level) once its listeners are bound.
SERVING = re.compile(r"tollgate serving grpc=(\S+) http=(\S+) debug=(\S+)")
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")

RULES = """\
domain: test
descriptors:
  # Two an hour per phone: the third check is refused, with a retry hint of about an hour.
  - key: phone
    rate_limit:
      name: otp-per-phone
      unit: hour
      requests_per_unit: 2
      algorithm: sliding_log
  # Three exports a day per user (a token bucket, so refunds give units back), one running at a time.
  - key: export_user
    rate_limit:
      name: exports-per-day
      unit: day
      requests_per_unit: 3
      algorithm: token_bucket
    concurrency:
      max_in_flight: 1
      lease_ttl: 5m
"""


class TollgateServer:
    """A `tollgate serve` process with the embedded store, on free loopback ports unless `grpc_addr`
    names one. Its log is kept in `log` for failure messages.
    """

    def __init__(self, binary: str, config_dir: pathlib.Path, grpc_addr: str = "127.0.0.1:0") -> None:
        # A clean environment, so nothing of the caller's (a REDIS_URL, a LOG_LEVEL) changes the server.
        env = {
            "PATH": os.environ.get("PATH", ""),
            "LOG_LEVEL": "warn",
            "LOG_FORMAT": "text",
            "NO_COLOR": "1",
            "TOLLGATE_RESPONSE_HEADERS": "ietf,retry-after",
        }
        args = [binary, "serve", "--config-dir", str(config_dir), "--grpc-addr", grpc_addr,
                "--http-addr", "127.0.0.1:0", "--debug-addr", "127.0.0.1:0"]
        self.log: List[str] = []
        self._serving = threading.Event()
        self.grpc = self.http = ""
        self._process = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, text=True)
        # Read the log on a thread: it finds the serving line, and keeps the pipe drained afterwards.
        self._reader = threading.Thread(target=self._read_log, daemon=True)
        self._reader.start()
        try:
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise

    def _read_log(self) -> None:
        assert self._process.stderr is not None
        with self._process.stderr as stderr:  # closed at end of file, when the server has exited
            for line in stderr:
                line = ANSI_ESCAPE.sub("", line.rstrip("\n"))
                self.log.append(line)
                serving = SERVING.search(line)
                if serving:
                    self.grpc, self.http = serving.group(1), serving.group(2)
                    self._serving.set()

    def _wait_until_ready(self) -> None:
        """Waits for the serving line, then for /healthcheck to say the rules are loaded."""
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not self._serving.wait(0.05):
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"tollgate did not start (exit {self._process.poll()}):\n" + self.logged())
        while not self._healthy():
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("tollgate did not become ready:\n" + self.logged())
            time.sleep(0.02)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http}/healthcheck", timeout=1) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def logged(self) -> str:
        """The server's log so far."""
        return "\n".join(self.log)

    def stop(self) -> None:
        """Kills the server and waits for it."""
        self._process.kill()
        self._process.wait()
        self._reader.join()


StartServer = Callable[..., TollgateServer]
"""The `start_server` fixture: starts a server of the test's own (keyword `grpc_addr`)."""


class Blackhole:
    """A TCP listener that accepts connections and never says a word: a Tollgate that hangs."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        # Accept polls, so close() can stop the thread and then close every connection it accepted.
        self._listener.settimeout(0.05)
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._accepted: List[socket.socket] = []
        self._closing = threading.Event()
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                connection, _ = self._listener.accept()
            except socket.timeout:
                continue
            self._accepted.append(connection)

    def close(self) -> None:
        """Stops listening and drops the connections."""
        self._closing.set()
        self._acceptor.join()
        self._listener.close()
        for connection in self._accepted:
            connection.close()


def unused_address() -> str:
    """A loopback address with nothing listening: a port the kernel just handed out, then released."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def run_async(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Runs an async test in its own event loop, so the tests need no pytest plugin."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


def new_key() -> str:
    """A descriptor value no other test uses, so tests share one server without sharing budgets."""
    return os.urandom(8).hex()

