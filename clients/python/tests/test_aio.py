"""The asyncio client against a real Tollgate: the same answers as the sync client's."""

import pytest
from support import PATIENT_DEADLINE, TollgateServer, run_async

import tollgate
import tollgate.aio


def connect(server: TollgateServer) -> tollgate.aio.Client:
    return tollgate.aio.Client(server.grpc, domain="test", deadline=PATIENT_DEADLINE)


@run_async
async def test_check_is_allowed_until_the_limit_then_refused(server: TollgateServer, key: str) -> None:
    async with connect(server) as client:
        decisions = [await client.check([{"phone": key}]) for _ in range(3)]

        assert [decision.allowed for decision in decisions] == [True, True, False]
        assert 3590 < decisions[2].retry_after <= 3600
        assert any(name == "RateLimit" for name, _ in decisions[0].headers)
        assert client.fail_open_count == 0


@run_async
async def test_peek_and_refund(server: TollgateServer, key: str) -> None:
    export = [{"export_user": key}]
    async with connect(server) as client:
        decision = await client.check(export)
        assert (await client.peek(export)).remaining == (await client.peek(export)).remaining == 2

        await client.refund(decision, export)

        assert (await client.peek(export)).remaining == 3
        with pytest.raises(tollgate.RefundDenied):
            await client.refund(decision, export)


@run_async
async def test_all_or_nothing(server: TollgateServer, key: str) -> None:
    async with connect(server) as client:
        await client.check([{"phone": key}], cost=2)

        assert not (await client.check_all_or_nothing([{"export_user": key}, {"phone": key}])).allowed
        assert (await client.peek([{"export_user": key}])).remaining == 3


@run_async
async def test_the_async_context_manager_holds_the_lease_until_exit(server: TollgateServer, key: str) -> None:
    export = [{"export_user": key}]
    async with connect(server) as client:
        async with client.acquire(export) as lease:
            assert lease.held
            refused = await client.acquire(export)
            assert not refused.allowed and 299 < refused.retry_after <= 300

        assert not lease.held
        assert (await client.acquire(export)).allowed


@run_async
async def test_renew_and_release(server: TollgateServer, key: str) -> None:
    async with connect(server) as client:
        lease = await client.acquire([{"export_user": key}], ttl=30)

        await lease.renew(ttl=60)

        assert lease.ttl == 60
        assert await lease.release() is True
        assert await lease.release() is False
        with pytest.raises(tollgate.LeaseNotFound):
            await lease.renew()


@run_async
async def test_a_malformed_request_raises(server: TollgateServer) -> None:
    async with connect(server) as client:
        with pytest.raises(tollgate.TollgateError) as error:
            await client.check([])

        assert not isinstance(error.value, tollgate.Unavailable)
