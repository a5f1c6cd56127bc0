"""The exceptions the clients raise, and which gRPC status becomes which."""

from typing import Optional

import grpc


class TollgateError(Exception):
    """A call to Tollgate failed. Raised as is for errors that are the caller's (a malformed request,
    such as no descriptors: `INVALID_ARGUMENT`), whatever the failure policy; the subclasses below name
    the failures a caller can act on.

    Attributes:
        code: the gRPC status of the failed call, or None when the client refused it before sending.
        details: the server's (or gRPC's) message.
    """

    def __init__(self, details: str, code: Optional[grpc.StatusCode] = None) -> None:
        super().__init__(f"{code.name}: {details}" if code is not None else details)
        self.code = code
        self.details = details


class Unavailable(TollgateError):
    """Tollgate could not be reached in time: the deadline passed, the connection failed, or the server
    answered `UNAVAILABLE` (its store is down and no rule's `failure_mode` answered).

    Raised by checks and acquires when the client fails closed, and by refunds, releases and renewals
    whatever the policy: there is nothing to fail open to.
    """


class RefundDenied(TollgateError):
    """The server refused a refund token (`PERMISSION_DENIED`): forged, altered, expired, already used,
    or sent with another domain or other descriptors than its check's. Nothing was refunded.
    """


class LeaseNotFound(TollgateError):
    """The lease holds no live slot (`NOT_FOUND` on renewal): it expired, was released, or was refused."""


class UnknownDomain(TollgateError):
    """No rules define the client's domain (`NOT_FOUND`, "unknown domain '…'"): a typo in the domain, or
    rules not deployed. Raised whatever the failure policy: failing open would silently disable every
    limit of the domain.
    """


# Deadline exceeded and UNAVAILABLE are the failures of reaching Tollgate (gRPC reports a refused or
# dropped connection as UNAVAILABLE), so they alone become Unavailable, the one error the failure
# policy turns into a pass. Every other status means the server answered and the request was wrong,
# which failing open would only hide.
_BY_CODE = {
    grpc.StatusCode.DEADLINE_EXCEEDED: Unavailable,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.PERMISSION_DENIED: RefundDenied,
    grpc.StatusCode.NOT_FOUND: LeaseNotFound,
}


def error_for(error: grpc.RpcError) -> TollgateError:
    """The exception that stands for a failed gRPC call (`grpc.RpcError` and `grpc.aio.AioRpcError` both
    carry `code()` and `details()`).
    """
    code: grpc.StatusCode = error.code()
    details: str = error.details() or ""
    if code == grpc.StatusCode.NOT_FOUND and details.startswith("unknown domain"):
        return UnknownDomain(details, code)
    return _BY_CODE.get(code, TollgateError)(details, code)
