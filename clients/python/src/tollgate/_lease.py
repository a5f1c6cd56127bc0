"""Concurrency leases: what every lease knows of itself, and the sync Lease."""

import logging
from typing import Any, Callable, Optional

from tollgate._calls import Call, Calls, Grant
from tollgate._decision import whole_seconds
from tollgate._descriptors import Normalized
from tollgate._errors import LeaseNotFound, Unavailable

logger = logging.getLogger("tollgate")


class LeaseState:
    """What a lease knows of itself; `tollgate.Lease` and `tollgate.aio.Lease` add the calls."""

    def __init__(self, calls: Calls, descriptors: Normalized, grant: Grant) -> None:
        self._calls = calls
        self._grant = grant
        self._ttl = grant.ttl
        self._held = grant.lease_id is not None
        self.descriptors = descriptors
        """The descriptors whose slots the lease takes, as (key, value) tuples."""

    @property
    def allowed(self) -> bool:
        """The work may go ahead: the slots are held, or the acquire failed open."""
        return self._grant.allowed

    @property
    def held(self) -> bool:
        """The lease holds slots on the server: acquired, and not yet released or found expired."""
        return self._held

    @property
    def failed_open(self) -> bool:
        """Tollgate could not be reached and the client's policy let the work go ahead; the lease holds
        nothing, and renewing or releasing it does nothing.
        """
        return self._grant.failed_open

    @property
    def id(self) -> Optional[str]:
        """The server's id for the lease; None when it was refused or failed open."""
        return self._grant.lease_id

    @property
    def ttl(self) -> Optional[float]:
        """Seconds the lease lives from its last acquire or renewal; None when it holds nothing."""
        return self._ttl

    @property
    def retry_after(self) -> Optional[float]:
        """When refused: seconds until the oldest lease in the way expires (a release may free a slot
        sooner).
        """
        return self._grant.retry_after

    def retry_after_seconds(self) -> int:
        """`retry_after` for a `Retry-After` header: whole seconds, rounded up, at least 1."""
        return whole_seconds(self.retry_after)

    def _renewal(self, ttl: Optional[float]) -> Optional[Call[Optional[float]]]:
        """The call that renews the lease; None for a lease that failed open, which holds nothing to
        renew. A refused or released lease raises LeaseNotFound, as the server would.
        """
        if self.failed_open:
            return None
        if not self._held or self.id is None:
            raise LeaseNotFound("the lease holds no slot: it was refused or released")
        return self._calls.renew(self.descriptors, self.id, ttl)

    def _release(self) -> Optional[Call[bool]]:
        """The call that releases the lease; None when it holds nothing."""
        if not self._held or self.id is None:
            return None
        return self._calls.release(self.descriptors, self.id)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(id={self.id!r}, allowed={self.allowed}, held={self.held}, "
                f"failed_open={self.failed_open}, ttl={self.ttl}, retry_after={self.retry_after})")


class Lease(LeaseState):
    """One in-flight slot of every descriptor's `concurrency` rule, from `Client.acquire`.

    Check `allowed` before doing the work: a refused lease (every slot taken) holds nothing and says how
    long to wait in `retry_after`. As a context manager the lease is released on exit, and a release
    that cannot reach Tollgate is logged rather than raised: the lease expires after its TTL anyway.

        with client.acquire([{"export_user": user}]) as lease:
            if not lease.allowed:
                return too_many_requests(lease.retry_after_seconds())
            run_the_export()
    """

    def __init__(self, run: Callable[[Call[Any]], Any], calls: Calls, descriptors: Normalized,
                 grant: Grant) -> None:
        super().__init__(calls, descriptors, grant)
        self._run = run

    def renew(self, ttl: Optional[float] = None) -> None:
        """Extends the lease by `ttl` seconds (by default, and at most, the rules' `lease_ttl`) from now.

        Does nothing on a lease that failed open. Raises LeaseNotFound when the lease holds no slot any
        more (refused, released, or expired), and Unavailable when Tollgate cannot be reached.
        """
        call = self._renewal(ttl)
        if call is None:
            return
        try:
            self._ttl = self._run(call)
        except LeaseNotFound:
            self._held = False
            raise

    def release(self) -> bool:
        """Frees the lease's slots; returns whether it still held all of them (False: some had expired,
        or it held nothing). Releasing twice does nothing the second time. Raises Unavailable when
        Tollgate cannot be reached (the lease is then still held, so the release can be retried).
        """
        call = self._release()
        if call is None:
            return False
        released: bool = self._run(call)
        self._held = False
        return released

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self.release()
        except Unavailable as error:
            logger.warning("cannot release Tollgate lease %s (%s); it expires after its TTL", self.id, error)
