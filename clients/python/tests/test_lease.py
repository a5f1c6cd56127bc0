"""The sync client's concurrency leases against a real Tollgate (one export at a time per user)."""

import time

import pytest

import tollgate


def test_a_second_lease_is_refused_until_the_first_is_released(client: tollgate.Client, key: str) -> None:
    export = [{"export_user": key}]
    first = client.acquire(export)

    second = client.acquire(export)

    assert first.allowed and first.held and first.id and not first.failed_open
    assert 299 < first.ttl <= 300  # the rule's lease_ttl
    assert not second.allowed and not second.held and second.id is None
    assert 299 < second.retry_after <= 300  # until the first lease would expire
    assert second.retry_after_seconds() == 300
    assert first.release() is True
    assert client.acquire(export).held


def test_the_context_manager_releases_on_exit(client: tollgate.Client, key: str) -> None:
    export = [{"export_user": key}]

    with client.acquire(export) as lease:
        assert lease.held
        assert not client.acquire(export).allowed

    assert not lease.held
    with client.acquire(export) as again:
        assert again.allowed


def test_the_context_manager_releases_when_the_work_raises(client: tollgate.Client, key: str) -> None:
    export = [{"export_user": key}]

    with pytest.raises(ZeroDivisionError), client.acquire(export):
        _ = 1 / 0

    assert client.acquire(export).allowed


def test_a_refused_lease_releases_nothing(client: tollgate.Client, key: str) -> None:
    export = [{"export_user": key}]
    with client.acquire(export):
        refused = client.acquire(export)

        assert refused.release() is False
        with pytest.raises(tollgate.LeaseNotFound):
            refused.renew()


def test_releasing_twice_does_nothing_the_second_time(client: tollgate.Client, key: str) -> None:
    lease = client.acquire([{"export_user": key}])

    assert lease.release() is True
    assert lease.release() is False


def test_renew_sets_a_new_ttl(client: tollgate.Client, key: str) -> None:
    lease = client.acquire([{"export_user": key}], ttl=30)
    assert lease.ttl == 30

    lease.renew(ttl=60)

    assert lease.ttl == 60
    lease.renew()
    assert lease.ttl == 300  # by default the rule's lease_ttl
    assert lease.release() is True


def test_renewing_an_expired_lease_raises_lease_not_found(client: tollgate.Client, key: str) -> None:
    export = [{"export_user": key}]
    lease = client.acquire(export, ttl=0.05)
    # The one real wait in these tests: the server's clock decides expiry, and there is no other way
    # to let a lease run out.
    time.sleep(0.3)

    with pytest.raises(tollgate.LeaseNotFound):
        lease.renew()

    assert not lease.held
    assert client.acquire(export).allowed  # the expired lease freed its slot
