"""An HTTP app that asks Tollgate before sending an SMS: 5 per hour per phone number
(examples/config/api.yaml). A refusal is answered 429 with Retry-After and Tollgate's headers.

    python3 -m venv .venv && .venv/bin/pip install -r examples/python/requirements.txt
    TOLLGATE_RESPONSE_HEADERS=ietf,retry-after tollgate serve --config-dir examples/config &
    .venv/bin/python examples/python/limited_app.py &
    for i in 1 2 3 4 5 6; do curl -s -o /dev/null -w '%{http_code}\\n' -X POST 'http://127.0.0.1:3001/send-otp?phone=5550100'; done

The gRPC stubs are generated from proto/ at start (grpcio-tools), so nothing generated is committed.
TOLLGATE_ADDR (default 127.0.0.1:8081) and APP_PORT (default 3001) move things.
"""

import json
import os
import pathlib
import sys
import tempfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import grpc
from grpc_tools import protoc

PROTO_ROOT = pathlib.Path(__file__).resolve().parents[2] / "proto"


def load_stubs():
    """Compiles Envoy's rate limit protos into a temporary directory and imports them."""
    out = tempfile.mkdtemp(prefix="tollgate-stubs-")
    include = pathlib.Path(protoc.__file__).parent / "_proto"  # google/protobuf/*.proto
    rls = "envoy/service/ratelimit/v3/rls.proto"
    deps = ["envoy/extensions/common/ratelimit/v3/ratelimit.proto", "envoy/type/v3/ratelimit_unit.proto",
            "envoy/config/core/v3/base.proto"]
    args = ["protoc", f"-I{PROTO_ROOT}", f"-I{include}", f"--python_out={out}", f"--grpc_python_out={out}", rls, *deps]
    if protoc.main(args) != 0:
        sys.exit("cannot compile the protos in " + str(PROTO_ROOT))
    sys.path.insert(0, out)
    from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2 as descriptor_pb2
    from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
    return rls_pb2, rls_pb2_grpc, descriptor_pb2


rls_pb2, rls_pb2_grpc, descriptor_pb2 = load_stubs()
channel = grpc.insecure_channel(os.environ.get("TOLLGATE_ADDR", "127.0.0.1:8081"))
tollgate = rls_pb2_grpc.RateLimitServiceStub(channel)


def check(entries):
    """Asks Tollgate; returns (allowed, retry_after_seconds, headers). Fails open if Tollgate is down."""
    descriptor = descriptor_pb2.RateLimitDescriptor(
        entries=[descriptor_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries])
    request = rls_pb2.RateLimitRequest(domain="api", descriptors=[descriptor])
    try:
        response = tollgate.ShouldRateLimit(request, timeout=0.05)
    except grpc.RpcError as error:
        print(f"Tollgate unreachable ({error.code()}): letting the request through", file=sys.stderr)
        return True, 0, []
    over = response.overall_code == rls_pb2.RateLimitResponse.OVER_LIMIT
    waits = [s.duration_until_reset.seconds + (1 if s.duration_until_reset.nanos else 0)
             for s in response.statuses if s.code == rls_pb2.RateLimitResponse.OVER_LIMIT]
    headers = [(h.key, h.value) for h in response.response_headers_to_add]
    return not over, max(waits, default=1), headers


class App(BaseHTTPRequestHandler):
    def do_POST(self):
        url = urlparse(self.path)
        phone = parse_qs(url.query).get("phone", [""])[0]
        if url.path != "/send-otp" or not phone:
            return self.reply(404, {"error": "not found"}, [])
        allowed, retry_after, headers = check([("path", "/auth/otp"), ("phone", phone)])
        if not allowed:
            if not any(k.lower() == "retry-after" for k, _ in headers):
                headers.append(("Retry-After", str(retry_after)))
            return self.reply(429, {"error": "rate_limited", "retry_after": retry_after}, headers)
        # ...the expensive work (sending the SMS) happens only here.
        self.reply(200, {"sent": True}, headers)

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
