"""The deadline every call gets, and the one failure policy for when Tollgate cannot be reached in it."""

import logging
import threading
import time
from typing import Literal, Tuple, TypeVar

import grpc

from tollgate._calls import Call
from tollgate._errors import Unavailable, error_for

Failure = Literal["open", "closed"]
"""What checks and acquires do when Tollgate cannot be reached: "open" lets the work go ahead (and
counts it), "closed" raises Unavailable."""

DEFAULT_DEADLINE = 0.025
"""Seconds. Tollgate answers in about a millisecond; 25 ms leaves room for a slow answer while keeping a
stalled Tollgate from stalling every request that asks it."""

# An outage fails every request open; one line every ten seconds says so without flooding the log (the
# exact number is in fail_open_count).
WARNING_INTERVAL = 10.0

T = TypeVar("T")

logger = logging.getLogger("tollgate")


class Policy:
    """A client's deadline and failure policy, and its count of decisions that failed open."""

    def __init__(self, deadline: float, failure: Failure) -> None:
        if not deadline > 0:
            raise ValueError(f"deadline is a positive number of seconds, got {deadline!r}")
        if failure not in ("open", "closed"):
            raise ValueError(f'failure is "open" or "closed", got {failure!r}')
        self.deadline = deadline
        """Seconds each call may take. A call made while the channel is not connected (Tollgate down or
        restarting) waits for it, up to this deadline, rather than failing at once: the wait is no
        longer than a hanging Tollgate costs anyway, a Tollgate that comes back is used by the first
        call after, and the waiting call is what drives a sync channel's reconnection (gRPC's sync
        stack only polls a connection attempt while a call waits on it, or at its five-second backup
        poll)."""
        self.failure = failure
        # Sync clients are shared between threads; a lock keeps the count exact.
        self._lock = threading.Lock()
        self._fail_open_count = 0
        self._last_warning = float("-inf")  # so the first failure is logged

    @property
    def fail_open_count(self) -> int:
        """How many checks and acquires failed open so far."""
        return self._fail_open_count

    def recover(self, error: grpc.RpcError, call: Call[T]) -> T:
        """The result of `call`, which failed with `error`: its fail-open result when Tollgate could not be
        reached, the policy is open and the call has one; else raises the matching TollgateError.
        """
        failure = error_for(error)
        if not isinstance(failure, Unavailable) or self.failure == "closed" or call.fail_open is None:
            raise failure from error
        count, warn = self._count_fail_open()
        if warn:
            logger.warning("Tollgate unreachable (%s): letting the work go ahead (%d failed open so far)",
                           failure, count)
        return call.fail_open()

    def _count_fail_open(self) -> Tuple[int, bool]:
        """Counts one more decision that failed open; returns the count and whether to log it."""
        with self._lock:
            self._fail_open_count += 1
            now = time.monotonic()
            warn = now - self._last_warning >= WARNING_INTERVAL
            if warn:
                self._last_warning = now
            return self._fail_open_count, warn
