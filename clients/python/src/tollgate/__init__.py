"""A client for Tollgate's native rate-limit API: checks (with a cost, or a peek), refunds and
concurrency leases, with a deadline on every call and one failure policy.

    import tollgate

    limiter = tollgate.Client("127.0.0.1:8081", domain="api")
    decision = limiter.check([{"path": "/auth/otp", "phone": phone}])
    if not decision.allowed:
        ...  # 429, with Retry-After: decision.retry_after_seconds()

Modules:
    tollgate            the sync Client, Decision, Lease and the exceptions
    tollgate.aio        the same client for asyncio (grpc.aio)
    tollgate.asgi       RateLimitMiddleware for ASGI apps: 429 with Retry-After, or the app
    tollgate.v1         the generated gRPC stubs (see generate.py)
"""

from tollgate._client import Client
from tollgate._decision import Decision
from tollgate._descriptors import Descriptors, Entries
from tollgate._errors import LeaseNotFound, RefundDenied, TollgateError, Unavailable, UnknownDomain
from tollgate._lease import Lease
from tollgate._policy import DEFAULT_DEADLINE, Failure

__all__ = [
    "DEFAULT_DEADLINE",
    "Client",
    "Decision",
    "Descriptors",
    "Entries",
    "Failure",
    "Lease",
    "LeaseNotFound",
    "RefundDenied",
    "TollgateError",
    "Unavailable",
    "UnknownDomain",
]
