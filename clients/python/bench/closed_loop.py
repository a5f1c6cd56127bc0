"""A closed-loop load of the asyncio client's check against a Tollgate: CONCURRENCY checks in flight on
one channel, each followed at once by the next, for DURATION seconds after a one-second warm-up. Prints
one JSON line in the format of clients/node/bench/closed-loop.mjs, whose turns scripts/bench/bench-clients.sh
runs beside this one.

    python clients/python/bench/closed_loop.py --target 127.0.0.1:8081 [--concurrency 64] [--duration 10]

One descriptor, `user=u-N` over 10,000 keys, domain `bench`. Run it with the package installed (the
virtualenv clients/python/run-tests.sh keeps has it).
"""

import argparse
import asyncio
import json
import time
from typing import List, Tuple

import tollgate.aio

KEYS = 10_000
# Generous: a deadline that a busy machine never meets would measure the failure policy instead.
DEADLINE = 5.0


async def load(client: tollgate.aio.Client, concurrency: int, until: float) -> Tuple[List[float], int]:
    """Runs the load until `until`; returns the latencies (ms) of the checks completed, and the errors."""
    latencies: List[float] = []
    errors = 0
    counter = 0

    async def worker() -> None:
        nonlocal counter, errors
        while time.perf_counter() < until:
            key = counter % KEYS
            counter += 1
            started = time.perf_counter()
            try:
                await client.check([{"user": f"u-{key}"}])
            except tollgate.TollgateError:
                errors += 1
                continue
            latencies.append((time.perf_counter() - started) * 1000)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, errors


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="127.0.0.1:8081")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--duration", type=float, default=10)
    args = parser.parse_args()
    async with tollgate.aio.Client(args.target, domain="bench", deadline=DEADLINE, failure="closed") as client:
        await load(client, args.concurrency, time.perf_counter() + 1)  # warm-up: the connection
        started = time.perf_counter()
        cpu_before = time.process_time()
        latencies, errors = await load(client, args.concurrency, started + args.duration)
        cpu = time.process_time() - cpu_before
        elapsed = time.perf_counter() - started
    latencies.sort()

    def at(q: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 3)

    print(json.dumps({"call": "python-aio-check", "decisions_per_s": round(len(latencies) / elapsed),
                      "p50_ms": at(0.5), "p99_ms": at(0.99),
                      # The process's CPU per check (every thread, gRPC's own among them), in microseconds.
                      "client_cpu_us": round(cpu * 1e6 / max(len(latencies), 1), 1), "errors": errors}))


if __name__ == "__main__":
    asyncio.run(main())
