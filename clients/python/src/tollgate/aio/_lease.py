"""The asyncio lease, and what `Client.acquire` returns so that it can be awaited or entered."""

import logging
from typing import Any, Awaitable, Callable, Generator, Optional

from tollgate._calls import Call, Calls, Grant
from tollgate._descriptors import Normalized
from tollgate._errors import LeaseNotFound, Unavailable
from tollgate._lease import LeaseState

logger = logging.getLogger("tollgate")


class Lease(LeaseState):
    """One in-flight slot of every descriptor's `concurrency` rule, from `tollgate.aio.Client.acquire`:
    `tollgate.Lease` with awaitable calls. As an async context manager it is released on exit, and a
    release that cannot reach Tollgate is logged rather than raised (the lease expires after its TTL).

        async with client.acquire([{"export_user": user}]) as lease:
            if not lease.allowed:
                return too_many_requests(lease.retry_after_seconds())
            await run_the_export()
    """

    def __init__(self, run: Callable[[Call[Any]], Awaitable[Any]], calls: Calls, descriptors: Normalized,
                 grant: Grant) -> None:
        super().__init__(calls, descriptors, grant)
        self._run = run

    async def renew(self, ttl: Optional[float] = None) -> None:
        """As `tollgate.Lease.renew`: extends the lease by `ttl` seconds (by default the rules'
        `lease_ttl`); nothing for a lease that failed open; LeaseNotFound when it holds no slot.
        """
        call = self._renewal(ttl)
        if call is None:
            return
        try:
            self._ttl = await self._run(call)
        except LeaseNotFound:
            self._held = False
            raise

    async def release(self) -> bool:
        """As `tollgate.Lease.release`: frees the slots; returns whether the lease still held all of
        them. Raises Unavailable when Tollgate cannot be reached (the lease is then still held).
        """
        call = self._release()
        if call is None:
            return False
        released: bool = await self._run(call)
        self._held = False
        return released

    async def __aenter__(self) -> "Lease":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        try:
            await self.release()
        except Unavailable as error:
            logger.warning("cannot release Tollgate lease %s (%s); it expires after its TTL", self.id, error)


class Acquiring:
    """A lease being acquired: await it for the Lease, or enter it with `async with` to have the lease
    released on exit.
    """

    def __init__(self, acquire: Awaitable[Lease]) -> None:
        self._acquire = acquire
        self._lease: Optional[Lease] = None

    def __await__(self) -> Generator[Any, None, Lease]:
        return self._acquire.__await__()

    async def __aenter__(self) -> Lease:
        self._lease = await self._acquire
        return self._lease

    async def __aexit__(self, *exc_info: object) -> None:
        if self._lease is not None:
            await self._lease.__aexit__(*exc_info)
