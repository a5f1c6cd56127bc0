"""Performs the transport attacks of issues #30 and #44 against a running Tollgate binary and measures
what they cost.

Started by scripts/transport-attacks.sh, which builds the release binary and provides the `h2` package.
The server runs with an open-file limit of 1,024 (the common default) and its default bounds. For each
attack, the resident memory (peak), the open descriptors, and the time `/healthcheck` and a decision
(`POST /json`) take while the attack holds what it can are printed; the script exits non-zero if the
server stopped answering, or if its memory grew past the bound the settings give. Attacks 5 and 6
(#44) come from 127.0.0.1 and their victims from other loopback addresses: slow readers that fill the
HTTP listener, and an attacker that tries to close an idle Envoy connection and keep Envoy out.
"""

import argparse
import asyncio
import os
import resource
import socket
import ssl
import subprocess
import sys
import tempfile
import time

import h2.config
import h2.connection
import h2.events
import h2.exceptions

RULES = "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 100000}\n"
CHECK = b'{"domain":"edge","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}'
MIB = 1 << 20


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, binary, extra_env):
        self.dir = tempfile.mkdtemp()
        os.makedirs(os.path.join(self.dir, "rules"))
        with open(os.path.join(self.dir, "rules", "edge.yaml"), "w") as f:
            f.write(RULES)
        self.grpc, self.http, self.debug = free_port(), free_port(), free_port()
        env = dict(os.environ)
        env.update({
            "TOLLGATE_CONFIG_DIR": os.path.join(self.dir, "rules"),
            "TOLLGATE_GRPC_ADDR": f"127.0.0.1:{self.grpc}",
            "TOLLGATE_HTTP_ADDR": f"127.0.0.1:{self.http}",
            "TOLLGATE_DEBUG_ADDR": f"127.0.0.1:{self.debug}",
            "LOG_LEVEL": "warn",
        })
        env.update(extra_env)

        def limit_files():
            resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))

        self.log = open(os.path.join(self.dir, "server.log"), "w")
        self.process = subprocess.Popen([binary, "serve"], env=env, stdout=self.log, stderr=self.log,
                                        preexec_fn=limit_files)
        deadline = time.time() + 20
        while time.time() < deadline:
            if http_get(self.http, "/healthcheck", timeout=1)[0] == 200:
                return
            time.sleep(0.1)
        raise SystemExit("the server did not become ready")

    def rss_mib(self):
        with open(f"/proc/{self.process.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def fds(self):
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))

    def metric(self, name):
        _, body = http_get(self.debug, "/metrics", timeout=5)
        for line in body.splitlines():
            if line.startswith(name + " "):
                return int(float(line.split()[1]))
        return -1

    def connection_counters(self, *kinds):
        """`kind: value` for each tollgate_connections_<kind>_total."""
        return ", ".join(f"{kind}: {self.metric(f'tollgate_connections_{kind}_total')}" for kind in kinds)

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=30)
        self.log.close()
        with open(self.log.name) as f:
            warnings = [line for line in f if "WARN" in line or "refused" in line or "cap" in line]
        return warnings


def http_get(port, path, timeout=5.0, method="GET", body=b""):
    """(status, body), or (0, error) when no answer came in time."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(f"{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
                      f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        return int(head.split()[1]), rest.decode(errors="replace")
    except (OSError, IndexError, ValueError) as e:
        return 0, str(e)


def probe(server):
    """Milliseconds for /healthcheck and a decision, or the failure."""
    out = []
    for path, method, body in (("/healthcheck", "GET", b""), ("/json", "POST", CHECK)):
        start = time.monotonic()
        status, text = http_get(server.http, path, timeout=5, method=method, body=body)
        took = (time.monotonic() - start) * 1000
        out.append(f"{path} {status} in {took:.1f} ms" if status == 200 else f"{path} FAILED ({status} {text[:60]})")
    return "; ".join(out)


async def unfinished_grpc(server, connections, streams, message):
    """Each connection opens `streams` calls announcing a `message`-byte message and sends all but its
    last byte, as fast as flow control lets it; returns (streams refused, bytes sent)."""
    refused, sent = 0, 0

    async def one():
        nonlocal refused, sent
        reader, writer = await asyncio.open_connection("127.0.0.1", server.grpc)
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        pending = {}
        header = b"\0" + message.to_bytes(4, "big")
        for _ in range(streams):
            sid = conn.get_next_available_stream_id()
            conn.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":authority", "t"),
                                    (":path", "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"),
                                    ("content-type", "application/grpc"), ("te", "trailers")])
            pending[sid] = header + b"\0" * (message - 1)
        deadline = time.monotonic() + 20
        while pending and time.monotonic() < deadline:
            for sid in list(pending):
                data = pending[sid]
                try:
                    window = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
                except h2.exceptions.StreamClosedError:
                    del pending[sid]
                    continue
                while window > 0 and data:
                    conn.send_data(sid, data[:window])
                    sent += min(window, len(data))
                    data = data[window:]
                    window = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
                pending[sid] = data
                if not data:
                    del pending[sid]
            writer.write(conn.data_to_send())
            await writer.drain()
            try:
                chunk = await asyncio.wait_for(reader.read(65536), 0.2)
            except asyncio.TimeoutError:
                continue
            if not chunk:
                break
            for event in conn.receive_data(chunk):
                if isinstance(event, (h2.events.TrailersReceived, h2.events.ResponseReceived)):
                    if (b"grpc-status", b"8") in event.headers:
                        refused += 1
                        pending.pop(event.stream_id, None)
                elif isinstance(event, h2.events.StreamReset):
                    pending.pop(event.stream_id, None)
            writer.write(conn.data_to_send())
        return writer

    writers = await asyncio.gather(*(one() for _ in range(connections)))
    # Measured while the connections and whatever they hold are still open.
    peak, during = sample_while(server, 1), probe(server)
    for writer in writers:
        writer.close()
    return refused, sent, peak, during


def sample_while(server, seconds):
    peak, start = 0.0, time.monotonic()
    while time.monotonic() - start < seconds:
        peak = max(peak, server.rss_mib())
        time.sleep(0.1)
    return peak


def connect_from(source, port, receive=None, timeout=5):
    """A TCP connection to the server's `port` from the loopback address `source`."""
    s = socket.socket()
    if receive:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive)
    s.bind((source, 0))
    s.settimeout(timeout)
    s.connect(("127.0.0.1", port))
    return s


def slow_reader(port):
    """An HTTP connection from 127.0.0.1, served one `GET /metrics` (so it is in use), that then pipelines
    3,000 more into a 4 KiB receive buffer and never reads again; None if it was refused."""
    request = b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n"
    try:
        s = connect_from("127.0.0.1", port, receive=4096)
        s.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                return None
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = int([line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length")][0])
        while len(body) < length:
            chunk = s.recv(65536)
            if not chunk:
                return None
            body += chunk
        s.setblocking(False)
        try:
            s.send(request * 3000)
        except BlockingIOError:
            pass
        return s
    except (OSError, IndexError, ValueError):
        return None


def probe_from(source, port, path="/healthcheck", timeout=2.0):
    """(status, milliseconds) of one request from `source` on a new connection; status 0 if refused."""
    start = time.monotonic()
    try:
        with connect_from(source, port, timeout=timeout) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        return int(data.split()[1]), (time.monotonic() - start) * 1000
    except (OSError, IndexError, ValueError):
        return 0, (time.monotonic() - start) * 1000


DECISION = b"\x0a\x04edge\x12\x08\x0a\x06\x0a\x01k\x12\x01v"  # RateLimitRequest edge, k=v
RLS = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
HEALTH = "/grpc.health.v1.Health/Check"


class GrpcConnection:
    """One HTTP/2 connection from `source` making unary gRPC calls, blocking."""

    def __init__(self, source, port):
        self.sock = connect_from(source, port, timeout=3)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())

    def call(self, path, message=b""):
        """The call's grpc-status, or None if the connection failed."""
        try:
            sid = self.conn.get_next_available_stream_id()
            self.conn.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":authority", "t"),
                                         (":path", path), ("content-type", "application/grpc"),
                                         ("te", "trailers")])
            self.conn.send_data(sid, b"\0" + len(message).to_bytes(4, "big") + message, end_stream=True)
            self.sock.sendall(self.conn.data_to_send())
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return None
                for event in self.conn.receive_data(chunk):
                    if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)) \
                            and event.stream_id == sid:
                        status = dict(event.headers).get(b"grpc-status")
                        if status is not None:
                            return int(status)
                    elif isinstance(event, h2.events.ConnectionTerminated):
                        return None
                self.sock.sendall(self.conn.data_to_send())
        except (OSError, h2.exceptions.ProtocolError):
            return None

    def close(self):
        self.sock.close()


def grpc_connection(source, port):
    try:
        return GrpcConnection(source, port)
    except OSError:
        return None


def silent_connections(port, count):
    held = []
    for _ in range(count):
        try:
            held.append(socket.create_connection(("127.0.0.1", port), timeout=2))
        except OSError:
            break
    return held


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    args = parser.parse_args()
    ok = True

    print("== 1. unfinished gRPC messages: 3 connections x 1,000 streams x (1 MiB - 1 byte)")
    server = Server(args.binary, {})
    before = server.rss_mib()
    refused, sent, peak, during = asyncio.run(unfinished_grpc(server, 3, 1000, MIB))
    print(f"   RSS {before:.0f} -> peak {peak:.0f} MiB; {sent / MIB:.0f} MiB sent, {refused} streams refused "
          f"(RESOURCE_EXHAUSTED); during: {during}")
    # 3 connections x 4 MiB of unfinished bytes, decoder buffers twice that at most, plus the baseline.
    ok &= peak < before + 64 and "FAILED" not in during
    print(f"   over budget: {server.metric('tollgate_request_bytes_over_budget_total')}")
    server.stop()

    print("== 2. unfinished HTTP bodies: 100 connections x POST /v1/check of 1 MiB, all but one byte sent")
    server = Server(args.binary, {})
    before = server.rss_mib()
    held = []
    for _ in range(100):
        s = socket.create_connection(("127.0.0.1", server.http))
        s.sendall(f"POST /v1/check HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {MIB}\r\n\r\n".encode())
        s.setblocking(False)
        try:
            s.send(b" " * (MIB - 1))
        except BlockingIOError:
            pass
        held.append(s)
    peak, during = sample_while(server, 2), probe(server)
    print(f"   RSS {before:.0f} -> peak {peak:.0f} MiB; during: {during}; "
          f"over budget: {server.metric('tollgate_request_bytes_over_budget_total')}")
    # The process's budget (64 MiB by default) of unfinished bytes; the read buffers the bytes arrived
    # in are larger than the bytes, so memory may grow to about twice the budget.
    ok &= peak < before + 160 and "FAILED" not in during
    for s in held:
        s.close()
    server.stop()

    print("== 3. 1,100 silent gRPC connections and 1,100 trickling HTTP clients, open-file limit 1,024")
    server = Server(args.binary, {})
    silent = silent_connections(server.grpc, 1100)
    trickling = silent_connections(server.http, 1100)
    for s in trickling:
        try:
            s.sendall(b"GET /healthcheck HTTP/1.1\r\nHost: t\r\n")
        except OSError:
            pass
    print(f"   opened {len(silent)} + {len(trickling)}; descriptors {server.fds()}; debug port: "
          f"{http_get(server.debug, '/rlconfig')[0]}; refused so far: "
          f"{server.metric('tollgate_connections_refused_total')}")
    for second in range(12):
        for s in trickling:
            try:
                s.sendall(b"X-Slow: 1\r\n")
            except OSError:
                pass
        if second in (1, 11):
            answered = probe(server)
            print(f"   t={second} s: {answered}; descriptors {server.fds()}")
            ok &= "FAILED" not in answered
        time.sleep(1)
    print(f"   {server.connection_counters('timed_out', 'evicted', 'refused')}")
    for s in silent + trickling:
        s.close()
    warnings = server.stop()
    print(f"   log lines at WARN: {len(warnings)}")

    print("== 4. TLS: 256 silent connections from 127.0.0.1; 50 TLS clients from 127.0.0.2")
    tls_dir = tempfile.mkdtemp()
    key, cert = os.path.join(tls_dir, "tls.key"), os.path.join(tls_dir, "tls.crt")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"],
                   check=True, capture_output=True)
    server = Server(args.binary, {"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": cert,
                                  "GRPC_SERVER_TLS_KEY": key})
    silent = silent_connections(server.grpc, 256)
    context = ssl.create_default_context(cafile=cert)
    context.set_alpn_protocols(["h2"])
    served = 0
    for _ in range(50):
        try:
            raw = socket.socket()
            raw.bind(("127.0.0.2", 0))
            raw.settimeout(5)
            raw.connect(("127.0.0.1", server.grpc))
            with context.wrap_socket(raw, server_hostname="localhost"):
                served += 1
        except (OSError, ssl.SSLError):
            pass
    print(f"   handshakes completed for another address: {served}/50")
    ok &= served == 50
    for s in silent:
        s.close()
    server.stop()

    print("== 5. slow readers: 130 HTTP connections from 127.0.0.1, each served once, then 3,000 GET /metrics "
          "pipelined into a 4 KiB receive buffer, never read")
    server = Server(args.binary, {})
    readers = [r for r in (slow_reader(server.http) for _ in range(130)) if r]
    print(f"   held {len(readers)}; descriptors {server.fds()}")
    answered, same, slowest = 0, 0, 0.0
    for _ in range(10):
        status, took = probe_from("127.0.0.2", server.http)
        answered += status == 200
        slowest = max(slowest, took)
        # The attacker takes back the slot the probe took, then probes from its own address.
        for _ in range(2):
            reader = slow_reader(server.http)
            if reader:
                readers.append(reader)
        same += probe_from("127.0.0.1", server.http)[0] == 200
        time.sleep(2)
    print(f"   over 20 s: /healthcheck from 127.0.0.2 answered {answered}/10 (slowest {slowest:.1f} ms), "
          f"from the attacker's own address {same}/10; "
          f"{server.connection_counters('stalled', 'evicted', 'refused')}")
    ok &= answered == 10
    for reader in readers:
        reader.close()
    server.stop()

    print("== 6. an idle Envoy connection: cap 16; 15 attacker connections from 127.0.0.1 kept busy with a "
          "health check a second, 5 more once Envoy's has idled past the probation period")
    server = Server(args.binary, {"TOLLGATE_MAX_CONNECTIONS": "16", "TOLLGATE_IDLE_CONNECTION_PROBATION": "2s"})
    envoy = grpc_connection("127.0.0.2", server.grpc)
    first = envoy.call(RLS, DECISION) if envoy else None
    attackers = [c for c in (grpc_connection("127.0.0.1", server.grpc) for _ in range(15)) if c]
    start = time.monotonic()
    while time.monotonic() - start < 5:
        for attacker in attackers:
            attacker.call(HEALTH)
        time.sleep(1)
    more = [c for c in (grpc_connection("127.0.0.1", server.grpc) for _ in range(5)) if c]
    for attacker in more:
        attacker.call(HEALTH)
    calls, reconnects = 0, 0
    for _ in range(20):
        status = envoy.call(RLS, DECISION) if envoy else None
        if status is None:
            reconnects += 1
            envoy = grpc_connection("127.0.0.2", server.grpc)
            status = envoy.call(RLS, DECISION) if envoy else None
        calls += status == 0
        time.sleep(0.3)
    print(f"   Envoy's first call: {first}; then {calls}/20 calls OK over 6 s, {reconnects} reconnections; "
          f"{server.connection_counters('evicted', 'refused')}")
    ok &= first == 0 and calls == 20 and reconnects == 0
    for connection in attackers + more + ([envoy] if envoy else []):
        connection.close()
    server.stop()

    print("all bounds held" if ok else "A BOUND DID NOT HOLD")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
