"""The gRPC channel a client opens when it is not given one."""

from types import ModuleType
from typing import Any, List, Optional, Tuple

import grpc

DEFAULT_TARGET = "127.0.0.1:8081"
"""Tollgate's gRPC port on the same host."""

# gRPC waits up to two minutes between reconnection attempts by default, and fails calls at once while
# it waits: a Tollgate restarted during a deploy would see its clients fail open (or closed) for that
# long after it is back. Two seconds bounds that gap; the attempts cost a connect each, nothing more.
OPTIONS: List[Tuple[str, Any]] = [("grpc.max_reconnect_backoff_ms", 2000)]


def open_channel(grpc_module: ModuleType, target: str, credentials: Optional[grpc.ChannelCredentials]) -> Any:
    """A channel to `target`, over TLS when `credentials` are given. `grpc_module` is `grpc` or
    `grpc.aio`, whose channel constructors take the same arguments. The channel connects lazily, on the
    first call, so an application starts while Tollgate is down.
    """
    if credentials is None:
        return grpc_module.insecure_channel(target, options=OPTIONS)
    return grpc_module.secure_channel(target, credentials, options=OPTIONS)

