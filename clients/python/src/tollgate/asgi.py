"""RateLimitMiddleware: asks Tollgate before every HTTP request of an ASGI app (Starlette, FastAPI,
Quart, Django's ASGI handler, or a bare ASGI callable). Pure ASGI, no framework needed.

    import tollgate.aio
    from tollgate.asgi import RateLimitMiddleware

    def describe(scope):
        if scope["path"] != "/search":
            return None  # not limited: straight to the app
        client_ip = scope["client"][0] if scope.get("client") else "unknown"
        return [{"remote_address": client_ip}]

    app = RateLimitMiddleware(app, tollgate.aio.Client(domain="api"), describe)
"""

import json
import logging
from typing import Any, Awaitable, Callable, Iterable, List, MutableMapping, Optional, Tuple

from tollgate._decision import Decision
from tollgate._descriptors import Descriptors
from tollgate._errors import Unavailable
from tollgate.aio import Client

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

Describe = Callable[[Scope], Optional[Descriptors]]
"""Picks the descriptors of an HTTP request from its ASGI scope; None lets the request through
unchecked."""

logger = logging.getLogger("tollgate")


class RateLimitMiddleware:
    """Checks each HTTP request whose descriptors `describe` returns, consuming one unit.

    - Allowed: the app runs, and its response carries the rate-limit headers the server hands out
      (TOLLGATE_RESPONSE_HEADERS).
    - Refused: `429 Too Many Requests` with `Retry-After` (whole seconds, rounded up so never early),
      those headers, and a JSON body `{"error": "rate_limited", "retry_after": N}`; the app does not run.
    - Tollgate unreachable: the client's failure policy decides; it lets the request through when
      failing open, and the middleware answers `503 Service Unavailable` when it fails closed.

    Lifespan and websocket scopes, and requests `describe` returns None for, go straight to the app.
    """

    def __init__(self, app: ASGIApp, client: Client, describe: Describe) -> None:
        self.app = app
        self.client = client
        self.describe = describe

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        descriptors = self.describe(scope) if scope["type"] == "http" else None
        if descriptors is None:
            await self.app(scope, receive, send)
            return
        try:
            decision = await self.client.check(descriptors)
        except Unavailable as error:
            logger.warning("Tollgate unreachable (%s): refusing the request", error)
            await _respond(send, 503, [("content-type", "text/plain; charset=utf-8")],
                           b"rate limiter unavailable\n")
            return
        if not decision.allowed:
            await _too_many_requests(send, decision)
            return
        await self.app(scope, receive, _adding_headers(send, decision.headers))


def _adding_headers(send: Send, headers: List[Tuple[str, str]]) -> Send:
    """`send`, adding `headers` to the response's start."""
    if not headers:
        return send

    async def send_with_headers(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = dict(message)
            message["headers"] = [*message.get("headers", []), *_encoded(headers)]
        await send(message)

    return send_with_headers


async def _too_many_requests(send: Send, decision: Decision) -> None:
    retry_after = decision.retry_after_seconds()
    headers = list(decision.headers)
    # The server adds its own Retry-After when configured to (`retry-after` in
    # TOLLGATE_RESPONSE_HEADERS); a response must not carry two.
    if not any(name.lower() == "retry-after" for name, _ in headers):
        headers.append(("retry-after", str(retry_after)))
    headers.append(("content-type", "application/json"))
    body = json.dumps({"error": "rate_limited", "retry_after": retry_after}).encode()
    await _respond(send, 429, headers, body)


async def _respond(send: Send, status: int, headers: List[Tuple[str, str]], body: bytes) -> None:
    headers = [*headers, ("content-length", str(len(body)))]
    await send({"type": "http.response.start", "status": status, "headers": _encoded(headers)})
    await send({"type": "http.response.body", "body": body})


def _encoded(headers: Iterable[Tuple[str, str]]) -> List[Tuple[bytes, bytes]]:
    """Headers as ASGI wants them: lowercase names, latin-1 bytes."""
    return [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers]
