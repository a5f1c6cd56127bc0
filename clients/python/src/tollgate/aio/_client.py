"""The asyncio client."""

from typing import Any, Optional, TypeVar, Union

import grpc
import grpc.aio

from tollgate._calls import Call, Calls
from tollgate._channel import DEFAULT_TARGET, open_channel
from tollgate._decision import Decision
from tollgate._descriptors import Descriptors, normalize
from tollgate._policy import DEFAULT_DEADLINE, Failure, Policy
from tollgate.aio._lease import Acquiring, Lease
from tollgate.v1 import ratelimiter_pb2 as pb
from tollgate.v1.ratelimiter_pb2_grpc import RateLimiterStub

T = TypeVar("T")


class Client:
    """`tollgate.Client` for asyncio, over `grpc.aio`: the same arguments, deadline and failure policy,
    with awaitable calls.

    A `grpc.aio` channel belongs to the event loop it was created in, so the client opens its channel
    in the loop of its first call: the client itself can be created anywhere, at import time included,
    but must then be used from one loop. A channel passed in is used as is.
    """

    def __init__(self, target: str = DEFAULT_TARGET, *, domain: str, deadline: float = DEFAULT_DEADLINE,
                 failure: Failure = "open", channel: Optional[grpc.aio.Channel] = None,
                 credentials: Optional[grpc.ChannelCredentials] = None) -> None:
        if channel is not None and credentials is not None:
            raise ValueError("credentials are for a channel the client opens: configure your own channel")
        self._calls = Calls(domain)
        self._policy = Policy(deadline, failure)
        self._target = target
        self._credentials = credentials
        self._owns_channel = channel is None
        self._channel = channel
        self._stub = RateLimiterStub(channel) if channel is not None else None

    @property
    def domain(self) -> str:
        """The domain every call is made in."""
        return self._calls.domain

    @property
    def fail_open_count(self) -> int:
        """How many checks and acquires failed open since the client was created."""
        return self._policy.fail_open_count

    async def check(self, descriptors: Descriptors, cost: int = 1) -> Decision:
        """As `tollgate.Client.check`: may the work go ahead? Consumes `cost` when it may."""
        return await self._run(self._calls.check(normalize(descriptors), cost, pb.MODE_CONSUME))

    async def peek(self, descriptors: Descriptors, cost: int = 0) -> Decision:
        """As `tollgate.Client.peek`: would `cost` pass, and what is left? Consumes nothing."""
        return await self._run(self._calls.check(normalize(descriptors), cost, pb.MODE_PEEK))

    async def check_all_or_nothing(self, descriptors: Descriptors, cost: int = 1) -> Decision:
        """As `tollgate.Client.check_all_or_nothing`: a refused request consumes nothing anywhere."""
        return await self._run(self._calls.check(normalize(descriptors), cost, pb.MODE_ALL_OR_NOTHING))

    async def refund(self, decision_or_token: Union[Decision, str], descriptors: Descriptors,
                     cost: int = 0) -> None:
        """As `tollgate.Client.refund`: gives back what a check consumed (nothing for a decision without
        a token). Raises RefundDenied for a refused token, Unavailable when Tollgate cannot be reached.
        """
        call = self._calls.refund(normalize(descriptors), decision_or_token, cost)
        if call is not None:
            await self._run(call)

    def acquire(self, descriptors: Descriptors, ttl: Optional[float] = None) -> Acquiring:
        """As `tollgate.Client.acquire`: takes one in-flight slot of every descriptor's `concurrency`
        rule, all or none. Await the result for the Lease, or enter it, which releases the lease on
        exit: `async with client.acquire(descriptors) as lease:`.
        """
        normalized = normalize(descriptors)

        async def acquire() -> Lease:
            grant = await self._run(self._calls.acquire(normalized, ttl))
            return Lease(self._run, self._calls, normalized, grant)

        return Acquiring(acquire())

    async def close(self) -> None:
        """Closes the channel the client opened (not one it was given)."""
        if self._owns_channel and self._channel is not None:
            await self._channel.close()

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _run(self, call: Call[T]) -> T:
        method: Any = getattr(self._opened_stub(), call.method)
        try:
            # wait_for_ready: see Policy.deadline.
            response = await method(call.request, timeout=self._policy.deadline, wait_for_ready=True)
        except grpc.aio.AioRpcError as error:
            return self._policy.recover(error, call)
        return call.answer(response)

    def _opened_stub(self) -> RateLimiterStub:
        # Opened here rather than in __init__: a grpc.aio channel is bound to the running event loop.
        if self._stub is None:
            self._channel = open_channel(grpc.aio, self._target, self._credentials)
            self._stub = RateLimiterStub(self._channel)
        return self._stub
