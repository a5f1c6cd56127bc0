"""What each call sends and how its answer becomes a result, apart from how it is sent: the sync and the
asyncio clients share this and differ only in whether they await the stub.
"""

from dataclasses import dataclass
from typing import Any, Callable, Generic, List, Optional, TypeVar, Union

from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message

from tollgate._decision import Decision
from tollgate._descriptors import Normalized
from tollgate.v1 import ratelimiter_pb2 as pb

T = TypeVar("T")


@dataclass(frozen=True)
class Call(Generic[T]):
    """One RPC to make.

    Attributes:
        method: the stub's method name ("Check", "Refund", "Acquire" or "Release").
        request: the request message.
        answer: turns the response into the call's result.
        fail_open: the result when Tollgate cannot be reached and the client fails open; None for calls
            with nothing to fail open to (refunds, releases, renewals), which then always raise.
    """

    method: str
    request: Message
    answer: Callable[[Any], T]
    fail_open: Optional[Callable[[], T]] = None


@dataclass(frozen=True)
class Grant:
    """What an Acquire answered; a Lease wraps it.

    Attributes:
        allowed: the work may go ahead (the slots are held, or the acquire failed open).
        lease_id: the server's id for the lease; None when it holds nothing.
        ttl: seconds the lease lives unless renewed or released; None when it holds nothing.
        retry_after: when refused, seconds until the oldest lease in the way expires.
        failed_open: Tollgate could not be reached and the policy let the work go ahead.
    """

    allowed: bool
    lease_id: Optional[str] = None
    ttl: Optional[float] = None
    retry_after: Optional[float] = None
    failed_open: bool = False


class Calls:
    """Builds the calls of one domain (the rules file's `domain`)."""

    def __init__(self, domain: str) -> None:
        if not domain:
            raise ValueError("a domain is required: the `domain` of the rules file to check against")
        self.domain = domain

    def check(self, descriptors: Normalized, cost: int, mode: "pb.Mode") -> Call[Decision]:
        """A Check in `mode` (consume, peek or all-or-nothing)."""
        request = pb.CheckRequest(domain=self.domain, descriptors=_to_wire(descriptors), cost=cost, mode=mode)
        return Call("Check", request, _decision, lambda: Decision(allowed=True, failed_open=True))

    def refund(self, descriptors: Normalized, decision_or_token: Union[Decision, str],
               cost: int) -> Optional[Call[None]]:
        """A Refund of what a check consumed; None when its decision consumed nothing (it has no token:
        refused, a peek, failed open, or no limit applied), so there is nothing to give back.
        """
        if isinstance(decision_or_token, Decision):
            if decision_or_token.refund_token is None:
                return None
            decision_or_token = decision_or_token.refund_token
        request = pb.RefundRequest(domain=self.domain, descriptors=_to_wire(descriptors), cost=cost,
                                   refund_token=decision_or_token)
        return Call("Refund", request, lambda _: None)

    def acquire(self, descriptors: Normalized, ttl: Optional[float]) -> Call[Grant]:
        """An Acquire of a new lease."""
        request = pb.AcquireRequest(domain=self.domain, descriptors=_to_wire(descriptors), ttl=_duration(ttl))
        return Call("Acquire", request, _grant, lambda: Grant(allowed=True, failed_open=True))

    def renew(self, descriptors: Normalized, lease_id: str, ttl: Optional[float]) -> Call[Optional[float]]:
        """An Acquire that extends lease `lease_id`; its result is the new TTL in seconds."""
        request = pb.AcquireRequest(domain=self.domain, descriptors=_to_wire(descriptors), lease_id=lease_id,
                                    ttl=_duration(ttl))
        return Call("Acquire", request, lambda response: _seconds(response, "ttl"))

    def release(self, descriptors: Normalized, lease_id: str) -> Call[bool]:
        """A Release of lease `lease_id`; its result is whether the lease still held every slot."""
        request = pb.ReleaseRequest(domain=self.domain, descriptors=_to_wire(descriptors), lease_id=lease_id)
        return Call("Release", request, lambda response: all(r.released for r in response.results))


def _to_wire(descriptors: Normalized) -> List[pb.Descriptor]:
    """The descriptors as protobuf messages."""
    return [pb.Descriptor(entries=[pb.Entry(key=key, value=value) for key, value in entries])
            for entries in descriptors]


def _decision(response: pb.CheckResponse) -> Decision:
    limited = [result.remaining for result in response.results if result.HasField("limit")]
    return Decision(
        allowed=response.allowed,
        retry_after=_seconds(response, "retry_after"),
        remaining=min(limited) if limited else None,
        headers=[(header.name, header.value) for header in response.headers],
        refund_token=response.refund_token or None,
    )


def _grant(response: pb.AcquireResponse) -> Grant:
    if not response.acquired:
        return Grant(allowed=False, retry_after=_seconds(response, "retry_after"))
    return Grant(allowed=True, lease_id=response.lease_id, ttl=_seconds(response, "ttl"))


def _seconds(message: Message, field: str) -> Optional[float]:
    """A Duration field in seconds; None when it is not set."""
    if not message.HasField(field):
        return None
    duration: Duration = getattr(message, field)
    return duration.ToNanoseconds() / 1e9


def _duration(seconds: Optional[float]) -> Optional[Duration]:
    if seconds is None:
        return None
    if seconds <= 0:
        raise ValueError(f"a lease's ttl is a positive number of seconds, got {seconds}")
    duration = Duration()
    duration.FromNanoseconds(round(seconds * 1e9))
    return duration
