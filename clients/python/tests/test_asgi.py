"""RateLimitMiddleware driven directly, with a fake receive and send (no server framework), in front of
a real Tollgate.
"""

import json
from typing import Any, Dict, List, Optional

from support import PATIENT_DEADLINE, TollgateServer, run_async

import tollgate.aio
from tollgate.asgi import RateLimitMiddleware, Scope

Message = Dict[str, Any]


class App:
    """An ASGI app that answers 200 "ok" and remembers the scopes it saw."""

    def __init__(self) -> None:
        self.seen: List[str] = []

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        self.seen.append(scope["type"])
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"x-app", b"yes")]})
            await send({"type": "http.response.body", "body": b"ok"})


def http(path: str, phone: str = "") -> Scope:
    return {"type": "http", "method": "POST", "path": path, "query_string": phone.encode(), "headers": []}


def describe(scope: Scope) -> Optional[List[Dict[str, str]]]:
    """Limits /send-otp by the phone in the query string; nothing else."""
    if scope["path"] != "/send-otp":
        return None
    return [{"phone": scope["query_string"].decode()}]


async def call(app: Any, scope: Scope) -> List[Message]:
    """Runs one request through `app`; returns what it sent."""
    sent: List[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


def headers(response: List[Message]) -> Dict[str, str]:
    return {name.decode(): value.decode() for name, value in response[0]["headers"]}


@run_async
async def test_allowed_requests_reach_the_app_with_server_headers(server: TollgateServer, key: str) -> None:
    app = App()
    client = tollgate.aio.Client(server.grpc, domain="test", deadline=PATIENT_DEADLINE)

    response = await call(RateLimitMiddleware(app, client, describe), http("/send-otp", key))

    assert response[0]["status"] == 200 and response[1]["body"] == b"ok"
    assert headers(response)["x-app"] == "yes"
    assert headers(response)["ratelimit-policy"] == '"otp-per-phone";q=2;w=3600'
    assert app.seen == ["http"]
    await client.close()


@run_async
async def test_refused_requests_get_429_with_retry_after(server: TollgateServer, key: str) -> None:
    app = App()
    client = tollgate.aio.Client(server.grpc, domain="test", deadline=PATIENT_DEADLINE)
    limited = RateLimitMiddleware(app, client, describe)
    for _ in range(2):
        await call(limited, http("/send-otp", key))

    response = await call(limited, http("/send-otp", key))

    assert response[0]["status"] == 429
    assert app.seen == ["http", "http"]  # the third never reached the app
    sent = [name for name, _ in response[0]["headers"]]
    assert sent.count(b"retry-after") == 1  # the server's, not a second one
    assert 3590 <= int(headers(response)["retry-after"]) <= 3600
    assert headers(response)["ratelimit"].startswith('"otp-per-phone";r=0;')
    assert json.loads(response[1]["body"]) == {"error": "rate_limited",
                                               "retry_after": int(headers(response)["retry-after"])}
    await client.close()


@run_async
async def test_requests_describe_ignores_and_other_scopes_pass_through(server: TollgateServer) -> None:
    app = App()
    client = tollgate.aio.Client(server.grpc, domain="test", deadline=PATIENT_DEADLINE)
    limited = RateLimitMiddleware(app, client, describe)

    response = await call(limited, http("/search"))
    await call(limited, {"type": "lifespan"})
    await call(limited, {"type": "websocket", "path": "/send-otp"})

    assert response[0]["status"] == 200 and "ratelimit" not in headers(response)
    assert app.seen == ["http", "lifespan", "websocket"]
    await client.close()


@run_async
async def test_a_down_tollgate_gets_503_when_failing_closed(unused: str) -> None:
    app = App()
    client = tollgate.aio.Client(unused, domain="test", deadline=0.05, failure="closed")

    response = await call(RateLimitMiddleware(app, client, describe), http("/send-otp", "5550100"))

    assert response[0]["status"] == 503
    assert app.seen == []
    await client.close()


@run_async
async def test_a_down_tollgate_lets_requests_through_when_failing_open(unused: str) -> None:
    app = App()
    client = tollgate.aio.Client(unused, domain="test", deadline=0.05)

    response = await call(RateLimitMiddleware(app, client, describe), http("/send-otp", "5550100"))

    assert response[0]["status"] == 200
    assert client.fail_open_count == 1
    await client.close()
