#!/usr/bin/env python3
"""Checks examples/envoy/envoy.yaml against a real Tollgate and the Helm chart (run by check-chart.sh).

Envoy itself runs the file in tests/envoy/example.rs (the Envoy pass of scripts/test.sh). This check
needs no Envoy: the rate limit filter's settings; that the health check takes a draining replica out
before the chart's drain period ends (helm/tollgate/values.yaml, drainPeriodSeconds) and checks a
cluster that has had no traffic often (no_traffic_interval); and that every descriptor the route
actions produce meets a limit in examples/config. For each `rate_limits` entry, the descriptor Envoy
would send is built from the actions (sample header values, an IPv6 client address) and sent with
`tollgate query` to a `tollgate serve` of examples/config on free loopback ports; each answer must name
the limit it was counted against.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

import yaml

SAMPLES = {"user_id": "alice", "api_key": "key-123", "phone": " +15551234567 "}
CLIENT = "2001:db8:1:2::7"
FILTER = "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit"


def descriptors(bootstrap):
    """(route, [(key, value), ...]) for every rate_limits entry in the bootstrap."""
    for listener in bootstrap["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for f in chain["filters"]:
                hcm = f["typed_config"]
                for vh in hcm["route_config"]["virtual_hosts"]:
                    for route in vh["routes"]:
                        for limit in route["route"].get("rate_limits", []):
                            entries = []
                            for action in limit["actions"]:
                                (kind, spec), = action.items()
                                if kind == "generic_key":
                                    entries.append((spec.get("descriptor_key", "generic_key"), spec["descriptor_value"]))
                                elif kind == "remote_address":
                                    entries.append(("remote_address", CLIENT))
                                elif kind == "request_headers":
                                    entries.append((spec["descriptor_key"], SAMPLES[spec["descriptor_key"]]))
                                else:
                                    raise SystemExit(f"check_envoy_example: no sample for action {kind}")
                            yield str(route["match"]), entries


def filter_config(bootstrap):
    for listener in bootstrap["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for f in chain["filters"]:
                for hf in f["typed_config"]["http_filters"]:
                    if hf["typed_config"]["@type"] == FILTER:
                        return hf["typed_config"]
    raise SystemExit("check_envoy_example: no rate limit filter")


def seconds(duration):
    """Envoy's duration text ("1s", "0.25s", "500ms") in seconds."""
    text = str(duration)
    if text.endswith("ms"):
        return float(text[:-2]) / 1000
    if text.endswith("s"):
        return float(text[:-1])
    raise SystemExit(f"check_envoy_example: not a duration: {text!r}")


def health_check_failures(cluster, drain_seconds):
    """What is wrong with the cluster's health check for a fleet that drains for drain_seconds."""
    checks = cluster.get("health_checks", [])
    if len(checks) != 1 or "grpc_health_check" not in checks[0]:
        return ["cluster: not one gRPC health check"]
    check = checks[0]
    failures = []
    if check["grpc_health_check"].get("service_name") != "ratelimit":
        failures.append("health check: not the readiness service \"ratelimit\"")
    # NOT_SERVING is answered at once: after SIGTERM, Envoy gives up on the replica within
    # unhealthy_threshold checks of one interval each (each bounded by the timeout).
    worst = check["unhealthy_threshold"] * (seconds(check["interval"]) + seconds(check["timeout"]))
    if worst >= drain_seconds:
        failures.append(f"health check: up to {worst} s to see NOT_SERVING, not within the chart's "
                        f"{drain_seconds} s drain period")
    if seconds(check.get("no_traffic_interval", "60s")) > 10:
        failures.append("health check: no no_traffic_interval of 10 s or less (Envoy's default is 60 s)")
    return failures


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tollgate", required=True)
    parser.add_argument("--envoy", default="examples/envoy/envoy.yaml")
    parser.add_argument("--config", default="examples/config")
    parser.add_argument("--chart-values", default="helm/tollgate/values.yaml")
    args = parser.parse_args()

    bootstrap = yaml.safe_load(open(args.envoy))
    failures = []
    rl = filter_config(bootstrap)
    expected = {"failure_mode_deny": True, "enable_x_ratelimit_headers": "DRAFT_VERSION_03",
                "rate_limited_as_resource_exhausted": True}
    for key, value in expected.items():
        if rl.get(key) != value:
            failures.append(f"filter: {key} is {rl.get(key)!r}, expected {value!r}")
    if "timeout" not in rl:
        failures.append("filter: no timeout")
    service = rl["rate_limit_service"]
    if service.get("transport_api_version") != "V3":
        failures.append("filter: rate_limit_service is not V3")
    cluster_name = service["grpc_service"]["envoy_grpc"]["cluster_name"]
    cluster = next(c for c in bootstrap["static_resources"]["clusters"] if c["name"] == cluster_name)
    options = cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    if "http2_protocol_options" not in options["explicit_http_config"]:
        failures.append("cluster: not HTTP/2")
    drain = yaml.safe_load(open(args.chart_values))["drainPeriodSeconds"]
    failures.extend(health_check_failures(cluster, drain))
    address = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
    if (address["address"], address["port_value"]) != ("127.0.0.1", 8081):
        failures.append(f"cluster: Tollgate is not at 127.0.0.1:8081: {address}")

    env = {k: v for k, v in os.environ.items() if not k.startswith("TOLLGATE_")}
    with tempfile.TemporaryFile("w+") as log:
        server = subprocess.Popen(
            [args.tollgate, "serve", "--config-dir", args.config, "--grpc-addr", "127.0.0.1:0",
             "--http-addr", "127.0.0.1:0", "--debug-addr", "127.0.0.1:0"],
            stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            grpc = None
            for _ in range(100):
                log.seek(0)
                found = re.search(r"tollgate serving grpc=(\S+)", log.read())
                if found:
                    grpc = found.group(1)
                    break
                if server.poll() is not None:
                    break
                time.sleep(0.05)
            if not grpc:
                log.seek(0)
                raise SystemExit(f"check_envoy_example: tollgate serve did not start:\n{log.read()}")
            count = 0
            for route, entries in descriptors(bootstrap):
                count += 1
                descriptor = ",".join(f"{k}={v}" for k, v in entries)
                result = subprocess.run(
                    [args.tollgate, "query", "--addr", f"http://{grpc}", "--domain", rl["domain"], "-d", descriptor],
                    capture_output=True, text=True, env=env)
                answer = result.stdout.strip() or result.stderr.strip()
                if result.returncode != 0 or '"currentLimit"' not in answer:
                    failures.append(f"route {route}: descriptor ({descriptor}) meets no limit: {answer}")
                else:
                    name = re.search(r'"name":"([^"]+)"', answer)
                    print(f"  {route}: ({', '.join(k for k, _ in entries)}) -> {name.group(1) if name else '?'}")
        finally:
            server.terminate()
            server.wait(timeout=10)
    if failures:
        for f in failures:
            print(f"FAIL {f}", file=sys.stderr)
        return 1
    print(f"envoy example: filter settings and {count} descriptors checked against {args.config}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
