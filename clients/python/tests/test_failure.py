"""The deadline and the failure policy, sync and asyncio: a Tollgate that hangs (accepts connections and
never answers), one that is down, and one that goes away mid-lease.
"""

import logging
import time

import pytest
from support import StartServer, run_async

import tollgate
import tollgate.aio

DEADLINE = 0.05
# How long a call may take past its deadline: gRPC's timer and a busy machine, never a hang.
SLACK = 0.45
OTP = [{"phone": "5550100"}]


def test_a_hanging_tollgate_fails_open_within_the_deadline(blackhole: str) -> None:
    client = tollgate.Client(blackhole, domain="test", deadline=DEADLINE)

    started = time.monotonic()
    decision = client.check(OTP)

    assert time.monotonic() - started < DEADLINE + SLACK
    assert decision.allowed and decision.failed_open
    assert decision.refund_token is None and decision.remaining is None
    assert client.peek(OTP).failed_open
    assert client.fail_open_count == 2


def test_a_hanging_tollgate_raises_unavailable_when_failing_closed(blackhole: str) -> None:
    client = tollgate.Client(blackhole, domain="test", deadline=DEADLINE, failure="closed")

    started = time.monotonic()
    with pytest.raises(tollgate.Unavailable):
        client.check(OTP)

    assert time.monotonic() - started < DEADLINE + SLACK
    with pytest.raises(tollgate.Unavailable):
        client.acquire(OTP)
    assert client.fail_open_count == 0


def test_a_lease_that_failed_open_holds_nothing(unused: str) -> None:
    with tollgate.Client(unused, domain="test", deadline=DEADLINE) as client:
        lease = client.acquire([{"export_user": "ada"}])

        assert lease.allowed and lease.failed_open and not lease.held
        assert lease.release() is False
        lease.renew()  # nothing to renew, no error
        assert client.fail_open_count == 1


def test_refunds_raise_unavailable_whatever_the_policy(unused: str) -> None:
    client = tollgate.Client(unused, domain="test", deadline=DEADLINE)

    with pytest.raises(tollgate.Unavailable):
        client.refund("a-token", OTP)

    assert client.fail_open_count == 0


def test_a_client_created_while_tollgate_is_down_applies_the_policy(unused: str) -> None:
    # Channels connect on the first call, so creating the clients succeeds.
    failing_open = tollgate.Client(unused, domain="test", deadline=DEADLINE)
    failing_closed = tollgate.Client(unused, domain="test", deadline=DEADLINE, failure="closed")

    assert failing_open.check(OTP).failed_open
    with pytest.raises(tollgate.Unavailable):
        failing_closed.check(OTP)


def test_a_client_reconnects_once_tollgate_is_up(unused: str, start_server: StartServer) -> None:
    client = tollgate.Client(unused, domain="test", deadline=DEADLINE)
    assert client.check(OTP).failed_open

    start_server(grpc_addr=unused)

    # gRPC retries the connection after a backoff the client caps at two seconds.
    give_up = time.monotonic() + 5
    while client.check(OTP).failed_open:
        assert time.monotonic() < give_up, "the client never reconnected"
        time.sleep(0.05)


def test_a_lost_release_on_exit_is_logged_not_raised(start_server: StartServer,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    server = start_server()
    client = tollgate.Client(server.grpc, domain="test", deadline=0.5)
    caplog.set_level(logging.WARNING, logger="tollgate")

    with client.acquire([{"export_user": "ada"}]) as lease:
        assert lease.held
        server.stop()

    assert "cannot release Tollgate lease" in caplog.text
    assert lease.held  # as far as the client knows: it expires on the server after its TTL


def test_an_explicit_release_raises_when_tollgate_is_gone(start_server: StartServer) -> None:
    server = start_server()
    client = tollgate.Client(server.grpc, domain="test", deadline=0.5)
    lease = client.acquire([{"export_user": "ada"}])
    server.stop()

    with pytest.raises(tollgate.Unavailable):
        lease.release()


def test_failing_open_is_logged(unused: str, caplog: pytest.LogCaptureFixture) -> None:
    client = tollgate.Client(unused, domain="test", deadline=DEADLINE)

    with caplog.at_level(logging.WARNING, logger="tollgate"):
        client.check(OTP)
        client.check(OTP)

    # Once, not once per request: an outage would flood the log.
    assert caplog.text.count("Tollgate unreachable") == 1


@run_async
async def test_async_a_hanging_tollgate_fails_open_within_the_deadline(blackhole: str) -> None:
    async with tollgate.aio.Client(blackhole, domain="test", deadline=DEADLINE) as client:
        started = time.monotonic()
        decision = await client.check(OTP)

        assert time.monotonic() - started < DEADLINE + SLACK
        assert decision.allowed and decision.failed_open
        lease = await client.acquire([{"export_user": "ada"}])
        assert lease.allowed and lease.failed_open and not lease.held
        assert client.fail_open_count == 2


@run_async
async def test_async_a_hanging_tollgate_raises_unavailable_when_failing_closed(blackhole: str) -> None:
    async with tollgate.aio.Client(blackhole, domain="test", deadline=DEADLINE, failure="closed") as client:
        started = time.monotonic()
        with pytest.raises(tollgate.Unavailable):
            await client.check(OTP)

        assert time.monotonic() - started < DEADLINE + SLACK
        with pytest.raises(tollgate.Unavailable):
            await client.acquire(OTP)


@run_async
async def test_async_a_down_tollgate_applies_the_policy(unused: str) -> None:
    async with tollgate.aio.Client(unused, domain="test", deadline=DEADLINE) as client:
        assert (await client.check(OTP)).failed_open
        with pytest.raises(tollgate.Unavailable):
            await client.refund("a-token", OTP)
        assert client.fail_open_count == 1
