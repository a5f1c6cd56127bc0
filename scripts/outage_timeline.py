#!/usr/bin/env python3
"""A Redis outage as an operator sees it: a real `tollgate serve` on a real `redis-server`, Redis killed
for DOWN seconds (35 by default: longer than Envoy Gateway's liveness budget of 3 failures 10 s apart)
then restarted; `/healthcheck` and `/readyz` polled and one `/json` decision asked every 200 ms, with
`REDIS_HEALTH_CHECK_ACTIVE_CONNECTION` off (the default) and on. Prints the timeline as a Markdown table.

    scripts/outage-timeline.sh [path/to/tollgate]        (default: the release build)
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

POLL = 0.2
DOWN = float(os.environ.get("DOWN", "35"))
RULES = """domain: rd
descriptors:
  - key: open
    rate_limit: {unit: hour, requests_per_unit: 100000000, failure_mode: open}
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(port, workdir):
    return subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", workdir],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_redis(port):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit("redis-server did not start")


def http(method, url, body=None):
    request = urllib.request.Request(url, data=body, method=method)
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=2) as answer:
            return answer.status, answer.read(), time.monotonic() - started
    except urllib.error.HTTPError as error:
        return error.code, error.read(), time.monotonic() - started
    except OSError:
        return None, b"", time.monotonic() - started


def run(binary, follows_redis):
    work = tempfile.mkdtemp()
    rules = os.path.join(work, "rules")
    os.mkdir(rules)
    with open(os.path.join(rules, "rd.yaml"), "w") as f:
        f.write(RULES)
    port = free_port()
    redis = start_redis(port, work)
    wait_redis(port)
    env = dict(os.environ, REDIS_URL=f"127.0.0.1:{port}", TOLLGATE_REDIS_DEADLINE="20ms", LOG_LEVEL="warn",
               REDIS_HEALTH_CHECK_ACTIVE_CONNECTION="true" if follows_redis else "false")
    server = subprocess.Popen(
        [binary, "serve", "--config-dir", rules, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
         "--debug-addr", "127.0.0.1:0"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    http_addr = None
    for line in server.stderr:
        match = re.search(r"http\W+(127\.0\.0\.1:\d+)", line)
        if "tollgate serving" in line and match:
            http_addr = match.group(1)
            break
    if http_addr is None:
        raise SystemExit("no serving line")
    base = f"http://{http_addr}"
    body = json.dumps({"domain": "rd", "descriptors": [{"entries": [{"key": "open", "value": "probe"}]}]}).encode()
    samples = []
    started = time.monotonic()
    phase, killed_at, restarted_at = "before", None, None
    while True:
        now = time.monotonic() - started
        if phase == "before" and now >= 3:
            redis.kill()
            redis.wait()
            phase, killed_at = "down", now
        elif phase == "down" and now >= killed_at + DOWN:
            redis = start_redis(port, work)
            wait_redis(port)
            phase, restarted_at = "after", time.monotonic() - started
        elif phase == "after" and now >= restarted_at + 5:
            break
        health, _, _ = http("GET", f"{base}/healthcheck")
        ready, _, _ = http("GET", f"{base}/readyz")
        status, answer, latency = http("POST", f"{base}/json", body)
        remaining = None
        if status == 200:
            statuses = json.loads(answer).get("statuses", [{}])
            remaining = int(statuses[0].get("limitRemaining", 0))
        samples.append((now, phase, health, ready, status, remaining, latency))
        time.sleep(POLL)
    server.send_signal(signal.SIGTERM)
    server.wait(timeout=10)
    redis.kill()
    redis.wait()
    return samples, killed_at, restarted_at


def summarise(follows_redis, samples, killed_at, restarted_at):
    """A row of counts per phase, and the moments a probe's answer changed."""
    rows = []
    for phase in ("before", "down", "after"):
        taken = [s for s in samples if s[1] == phase]
        redis = sum(1 for s in taken if s[5])
        failure = sum(1 for s in taken if s[4] == 200 and s[5] == 0)
        errors = sum(1 for s in taken if s[4] != 200)
        worst = max(s[6] for s in taken) * 1000
        rows.append(f"| {follows_redis} | {phase} | {len(taken)} | {redis} | {failure} | {errors} | {worst:.1f} ms |")
    changes = [f"{killed_at:.1f} s Redis killed", f"{restarted_at:.1f} s Redis back"]
    for column, name in ((2, "/healthcheck"), (3, "/readyz")):
        last = None
        for sample in samples:
            if sample[column] != last:
                changes.append(f"{sample[0]:.1f} s {name} {sample[column]}")
                last = sample[column]
    back = next((s[0] for s in samples if s[1] == "after" and s[5]), None)
    if back is not None:
        changes.append(f"{back:.1f} s first decision from Redis")
    changes.sort(key=lambda c: float(c.split(" s ")[0]))
    return rows, changes


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else None
    if not binary:
        raise SystemExit("usage: outage_timeline.py path/to/tollgate")
    print(f"Redis down for {DOWN:.0f} s; probes and one /json decision every {POLL * 1000:.0f} ms.\n")
    print("| REDIS_HEALTH_CHECK_ACTIVE_CONNECTION | phase | calls | decided by Redis | by failure_mode | "
          "errors | slowest /json |")
    print("|---|---|---|---|---|---|---|")
    timelines = []
    for follows_redis in (False, True):
        samples, killed_at, restarted_at = run(binary, follows_redis)
        rows, changes = summarise(str(follows_redis).lower(), samples, killed_at, restarted_at)
        print("\n".join(rows))
        timelines.append((follows_redis, changes))
    print()
    for follows_redis, changes in timelines:
        print(f"- `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION={str(follows_redis).lower()}`: " + "; ".join(changes))


if __name__ == "__main__":
    main()
