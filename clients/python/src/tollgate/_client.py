"""The sync client."""

from typing import Any, Optional, TypeVar, Union

import grpc

from tollgate._calls import Call, Calls
from tollgate._channel import DEFAULT_TARGET, open_channel
from tollgate._decision import Decision
from tollgate._descriptors import Descriptors, normalize
from tollgate._lease import Lease
from tollgate._policy import DEFAULT_DEADLINE, Failure, Policy
from tollgate.v1 import ratelimiter_pb2 as pb
from tollgate.v1.ratelimiter_pb2_grpc import RateLimiterStub

T = TypeVar("T")


class Client:
    """A client of Tollgate's native API (`tollgate.v1.RateLimiter`) for one domain.

    Every call has a deadline. When Tollgate cannot be reached in it (the deadline passes, the
    connection fails, or the server answers `UNAVAILABLE`), `failure` decides what checks and acquires
    do: "open" (the default) lets the work go ahead, marks the answer `failed_open` and counts it in
    `fail_open_count`; "closed" raises `Unavailable`. Refunds, releases and renewals have nothing to
    fail open to and raise `Unavailable` either way. Any other error (a malformed request, say) is the
    caller's and is raised as a `TollgateError` whatever the policy.

    The channel connects on the first call, so creating a client never fails because Tollgate is down;
    a call made while it is down (or restarting) waits for it, up to the deadline. A client is
    thread-safe: share one per process (and per domain).

    Args:
        target: Tollgate's gRPC address, `host:port`.
        domain: the rules file's `domain` every call is made in.
        deadline: seconds each call may take.
        failure: "open" or "closed", see above.
        channel: a `grpc.Channel` to use instead of opening one to `target` (your own TLS, options or
            interceptors). The client does not close a channel it was given.
        credentials: `grpc.ChannelCredentials` to open the channel to `target` over TLS.
    """

    def __init__(self, target: str = DEFAULT_TARGET, *, domain: str, deadline: float = DEFAULT_DEADLINE,
                 failure: Failure = "open", channel: Optional[grpc.Channel] = None,
                 credentials: Optional[grpc.ChannelCredentials] = None) -> None:
        if channel is not None and credentials is not None:
            raise ValueError("credentials are for a channel the client opens: configure your own channel")
        self._calls = Calls(domain)
        self._policy = Policy(deadline, failure)
        self._owns_channel = channel is None
        if channel is None:
            channel = open_channel(grpc, target, credentials)
        self._channel: grpc.Channel = channel
        self._stub = RateLimiterStub(channel)

    @property
    def domain(self) -> str:
        """The domain every call is made in."""
        return self._calls.domain

    @property
    def fail_open_count(self) -> int:
        """How many checks and acquires failed open since the client was created: watch it (a metric,
        a log) to learn that requests are going through unchecked.
        """
        return self._policy.fail_open_count

    def check(self, descriptors: Descriptors, cost: int = 1) -> Decision:
        """Asks whether the work may go ahead, consuming `cost` units of every matching limit when it may.

        Each descriptor is decided on its own unless the domain sets `all_or_nothing: true`; see
        `check_all_or_nothing`. A refused check consumes nothing, except on a `fixed_window` limit.
        """
        return self._run(self._calls.check(normalize(descriptors), cost, pb.MODE_CONSUME))

    def peek(self, descriptors: Descriptors, cost: int = 0) -> Decision:
        """Asks whether `cost` units would pass now, and what would be left after them, consuming
        nothing. With `cost` 0, `remaining` says how many units are left ("3 exports left today").
        """
        return self._run(self._calls.check(normalize(descriptors), cost, pb.MODE_PEEK))

    def check_all_or_nothing(self, descriptors: Descriptors, cost: int = 1) -> Decision:
        """Like `check`, but consumes only if every descriptor allows it: a refused request consumes
        nothing anywhere.
        """
        return self._run(self._calls.check(normalize(descriptors), cost, pb.MODE_ALL_OR_NOTHING))

    def refund(self, decision_or_token: Union[Decision, str], descriptors: Descriptors,
               cost: int = 0) -> None:
        """Gives back what a check consumed, because the work it paid for did not happen.

        Pass the check's Decision (or its `refund_token`) and the same descriptors, in the same order.
        `cost` units go back to each descriptor, at most what it consumed; 0 gives back all of it. A
        token works once. A decision that consumed nothing (refused, a peek, failed open, or no limit
        applied) has no token, and refunding it does nothing.

        Raises RefundDenied when the server refuses the token (forged, expired, already used, other
        descriptors), and Unavailable when Tollgate cannot be reached, whatever the failure policy.
        """
        call = self._calls.refund(normalize(descriptors), decision_or_token, cost)
        if call is not None:
            self._run(call)

    def acquire(self, descriptors: Descriptors, ttl: Optional[float] = None) -> Lease:
        """Takes one in-flight slot of every descriptor's `concurrency` rule, all or none.

        The lease lives `ttl` seconds (by default, and at most, the rules' `lease_ttl`) unless renewed
        or released. Check `lease.allowed`: when every slot is taken the lease is refused, holds
        nothing, and `lease.retry_after` says how long until the oldest lease in the way expires. Use
        it as a context manager to release it when the work is done.
        """
        normalized = normalize(descriptors)
        grant = self._run(self._calls.acquire(normalized, ttl))
        return Lease(self._run, self._calls, normalized, grant)

    def close(self) -> None:
        """Closes the channel the client opened (not one it was given)."""
        if self._owns_channel:
            self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _run(self, call: Call[T]) -> T:
        method: Any = getattr(self._stub, call.method)
        try:
            # wait_for_ready: see Policy.deadline.
            response = method(call.request, timeout=self._policy.deadline, wait_for_ready=True)
        except grpc.RpcError as error:
            return self._policy.recover(error, call)
        return call.answer(response)
