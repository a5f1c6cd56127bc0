r"""An HTTP app that asks Tollgate's native API (tollgate.v1.RateLimiter) before its expensive work
(rules in examples/config/api.yaml):

- POST /send-otp?phone=N: 5 SMS an hour per phone number; a refusal is 429 with Retry-After and the
  server's rate-limit headers;
- POST /export (header x-user-id): one of the user's 3 exports a day, and one of 2 concurrent export
  slots (a concurrency lease) while it runs; a failed export (?fail=1) gets its budget back (Refund).

    python3 -m venv .venv && .venv/bin/pip install -r examples/python/requirements.txt
    TOLLGATE_RESPONSE_HEADERS=ietf,retry-after tollgate serve --config-dir examples/config &
    .venv/bin/python examples/python/limited_app.py &
    for i in 1 2 3 4 5 6; do curl -s -o /dev/null -w '%{http_code}\n' -X POST 'http://127.0.0.1:3001/send-otp?phone=5550100'; done

The gRPC stubs are generated from proto/ at start (grpcio-tools), so nothing generated is committed.
TOLLGATE_ADDR (default 127.0.0.1:8081) and APP_PORT (default 3001) move things.
"""

import json
import math
import os
import pathlib
import sys
import tempfile
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import grpc
from grpc_tools import protoc

PROTO_ROOT = pathlib.Path(__file__).resolve().parents[2] / "proto"


def load_stubs():
    """Compiles Tollgate's native API proto into a temporary directory and imports it."""
    out = tempfile.mkdtemp(prefix="tollgate-stubs-")
    include = pathlib.Path(protoc.__file__).parent / "_proto"  # google/protobuf/*.proto
    args = ["protoc", f"-I{PROTO_ROOT}", f"-I{include}", f"--python_out={out}", f"--grpc_python_out={out}",
            "tollgate/v1/ratelimiter.proto"]
    if protoc.main(args) != 0:
        sys.exit("cannot compile the protos in " + str(PROTO_ROOT))
    sys.path.insert(0, out)
    from tollgate.v1 import ratelimiter_pb2, ratelimiter_pb2_grpc
    return ratelimiter_pb2, ratelimiter_pb2_grpc


pb, pb_grpc = load_stubs()
channel = grpc.insecure_channel(os.environ.get("TOLLGATE_ADDR", "127.0.0.1:8081"))
tollgate = pb_grpc.RateLimiterStub(channel)
TIMEOUT = 0.05  # seconds; Tollgate answers in about a millisecond


def descriptors(*entries):
    return [pb.Descriptor(entries=[pb.Entry(key=k, value=v)]) for k, v in entries]


def whole_seconds(duration):
    """Retry-After in whole seconds, rounded up so the client never comes back early."""
    return max(1, math.ceil(duration.seconds + duration.nanos / 1e9))


class App(BaseHTTPRequestHandler):
    def do_POST(self):
        url = urlparse(self.path)
        query = parse_qs(url.query)
        try:
            if url.path == "/send-otp" and query.get("phone"):
                return self.send_otp(query["phone"][0])
            if url.path == "/export" and self.headers.get("x-user-id"):
                return self.export(self.headers["x-user-id"], query.get("fail") == ["1"])
        except grpc.RpcError as error:
            print(f"Tollgate unreachable ({error.code()})", file=sys.stderr)
            return self.reply(503, {"error": "rate limiter unavailable"}, [])
        return self.reply(404, {"error": "not found"}, [])

    def send_otp(self, phone):
        request = pb.CheckRequest(domain="api", descriptors=[pb.Descriptor(entries=[
            pb.Entry(key="path", value="/auth/otp"), pb.Entry(key="phone", value=phone)])])
        try:
            answer = tollgate.Check(request, timeout=TIMEOUT)
        except grpc.RpcError as error:
            # An SMS is cheap compared with locking users out: fail open, loudly.
            print(f"Tollgate unreachable ({error.code()}): letting the request through", file=sys.stderr)
            return self.reply(200, {"sent": True}, [])
        headers = [(h.name, h.value) for h in answer.headers]
        if not answer.allowed:
            retry_after = whole_seconds(answer.retry_after)
            if not any(k.lower() == "retry-after" for k, _ in headers):
                headers.append(("Retry-After", str(retry_after)))
            return self.reply(429, {"error": "rate_limited", "retry_after": retry_after}, headers)
        # ...the expensive work (sending the SMS) happens only here.
        self.reply(200, {"sent": True}, headers)

    def export(self, user, fail):
        wanted = descriptors(("export_user", user))
        budget = tollgate.Check(pb.CheckRequest(domain="api", descriptors=wanted), timeout=TIMEOUT)
        if not budget.allowed:
            seconds = whole_seconds(budget.retry_after)
            return self.reply(429, {"error": "no exports left today"}, [("Retry-After", str(seconds))])
        lease = tollgate.Acquire(pb.AcquireRequest(domain="api", descriptors=wanted), timeout=TIMEOUT)
        if not lease.acquired:
            # The check's refund token is the proof of what it consumed: the only way to give it back.
            tollgate.Refund(pb.RefundRequest(domain="api", descriptors=wanted,
                                             refund_token=budget.refund_token), timeout=TIMEOUT)
            seconds = whole_seconds(lease.retry_after)
            return self.reply(429, {"error": "two exports already running"}, [("Retry-After", str(seconds))])
        try:
            time.sleep(0.2)  # the expensive work
        finally:
            tollgate.Release(pb.ReleaseRequest(domain="api", descriptors=wanted, lease_id=lease.lease_id),
                             timeout=TIMEOUT)
        if fail:
            tollgate.Refund(pb.RefundRequest(domain="api", descriptors=wanted,
                                             refund_token=budget.refund_token), timeout=TIMEOUT)
            return self.reply(502, {"error": "export failed; it did not count"}, [])
        self.reply(200, {"export": "ready"}, [])

    def reply(self, status, body, headers):
        payload = json.dumps(body).encode()
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


if __name__ == "__main__":
    port = int(os.environ.get("APP_PORT", "3001"))
    print(f"listening on http://127.0.0.1:{port}", flush=True)
    ThreadingHTTPServer(("127.0.0.1", port), App).serve_forever()
