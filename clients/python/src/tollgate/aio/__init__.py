"""Tollgate's client for asyncio, over `grpc.aio`: `tollgate.Client` with awaitable calls.

    import tollgate.aio

    limiter = tollgate.aio.Client("127.0.0.1:8081", domain="api")
    decision = await limiter.check([{"path": "/auth/otp", "phone": phone}])
    async with limiter.acquire([{"export_user": user}]) as lease:
        if lease.allowed:
            await run_the_export()

Decision and the exceptions are `tollgate`'s.
"""

from tollgate.aio._client import Client
from tollgate.aio._lease import Acquiring, Lease

__all__ = ["Acquiring", "Client", "Lease"]
