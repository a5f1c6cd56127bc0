r"""An HTTP app that asks Tollgate before its expensive work, with the Python client in clients/python
(rules in examples/config/api.yaml):

- POST /send-otp?phone=N: 5 SMS an hour per phone number; a refusal is 429 with Retry-After and the
  server's rate-limit headers. If Tollgate cannot be reached the SMS goes out anyway (fail open);
- POST /export (header x-user-id): one of the user's 3 exports a day, and one of 2 concurrent export
  slots (a concurrency lease) while it runs; a failed export (?fail=1) gets its budget back (a
  refund). If Tollgate cannot be reached there is no export (fail closed: 503).

    python3 -m venv .venv && .venv/bin/pip install -r examples/python/requirements.txt
    TOLLGATE_RESPONSE_HEADERS=ietf,retry-after tollgate serve --config-dir examples/config &
    .venv/bin/python examples/python/limited_app.py &
    for i in 1 2 3 4 5 6; do curl -s -o /dev/null -w '%{http_code}\n' -X POST 'http://127.0.0.1:3001/send-otp?phone=5550100'; done

TOLLGATE_ADDR (default 127.0.0.1:8081) and APP_PORT (default 3001) move things; TOLLGATE_DEADLINE_MS
sets each call's deadline (default the client's, 25 ms).
"""

import json
import logging
import os
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import grpc
import tollgate


def deadline() -> float:
    """Seconds a call may take: TOLLGATE_DEADLINE_MS, else the client's default."""
    millis = os.environ.get("TOLLGATE_DEADLINE_MS")
    if millis is None:
        return tollgate.DEFAULT_DEADLINE
    try:
        return float(millis) / 1000
    except ValueError:
        raise SystemExit(f"TOLLGATE_DEADLINE_MS={millis!r}: not a number of milliseconds") from None


# One connection, two policies: an SMS is cheap compared with locking users out, an export is not.
channel = grpc.insecure_channel(os.environ.get("TOLLGATE_ADDR", "127.0.0.1:8081"))
sms_limiter = tollgate.Client(domain="api", channel=channel, failure="open", deadline=deadline())
export_limiter = tollgate.Client(domain="api", channel=channel, failure="closed", deadline=deadline())


class App(BaseHTTPRequestHandler):
    def do_POST(self):
        url = urlparse(self.path)
        query = parse_qs(url.query)
        try:
            if url.path == "/send-otp" and query.get("phone"):
                return self.send_otp(query["phone"][0])
            if url.path == "/export" and self.headers.get("x-user-id"):
                return self.export(self.headers["x-user-id"], query.get("fail") == ["1"])
        except tollgate.Unavailable:
            return self.reply(503, {"error": "rate limiter unavailable"})
        return self.reply(404, {"error": "not found"})

    def send_otp(self, phone):
        decision = sms_limiter.check([{"path": "/auth/otp", "phone": phone}])
        if not decision.allowed:
            return self.too_many_requests("rate_limited", decision.retry_after_seconds(), decision.headers)
        # ...the expensive work (sending the SMS) happens only here.
        self.reply(200, {"sent": True}, decision.headers)

    def export(self, user, fail):
        wanted = [{"export_user": user}]
        budget = export_limiter.check(wanted)
        if not budget.allowed:
            return self.too_many_requests("no exports left today", budget.retry_after_seconds())
        with export_limiter.acquire(wanted) as lease:
            if not lease.allowed:
                # The check's refund token is the proof of what it consumed: the only way to give it back.
                export_limiter.refund(budget, wanted)
                return self.too_many_requests("two exports already running", lease.retry_after_seconds())
            time.sleep(0.2)  # the expensive work
        if fail:
            export_limiter.refund(budget, wanted)
            return self.reply(502, {"error": "export failed; it did not count"})
        self.reply(200, {"export": "ready"})

    def too_many_requests(self, error, retry_after, headers=()):
        headers = list(headers)
        # The server sends its own Retry-After when TOLLGATE_RESPONSE_HEADERS asks for it.
        if not any(name.lower() == "retry-after" for name, _ in headers):
            headers.append(("Retry-After", str(retry_after)))
        self.reply(429, {"error": error, "retry_after": retry_after}, headers)

    def reply(self, status, body, headers=()):
        payload = json.dumps(body).encode()
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)  # the client logs when it fails open or loses a release
    port = int(os.environ.get("APP_PORT", "3001"))
    print(f"listening on http://127.0.0.1:{port}", flush=True)
    ThreadingHTTPServer(("127.0.0.1", port), App).serve_forever()
