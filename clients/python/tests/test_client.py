"""The sync client's checks, peeks and refunds against a real Tollgate."""

import math

import grpc
import pytest
from support import PATIENT_DEADLINE, TollgateServer

import tollgate


def header(decision: tollgate.Decision, name: str) -> str:
    """The value of header `name` (any case) in the decision; fails the test when it is missing."""
    values = [value for key, value in decision.headers if key.lower() == name.lower()]
    assert values, f"no {name} header in {decision.headers}"
    return values[0]


def test_check_is_allowed_until_the_limit_then_refused(client: tollgate.Client, key: str) -> None:
    otp = [{"phone": key}]

    first, second, third = client.check(otp), client.check(otp), client.check(otp)

    assert (first.allowed, second.allowed, third.allowed) == (True, True, False)
    assert (first.remaining, second.remaining, third.remaining) == (1, 0, 0)
    assert first.refund_token and third.refund_token is None
    assert 3590 < third.retry_after <= 3600  # the sliding log's oldest entry leaves in about an hour
    assert third.retry_after_seconds() == math.ceil(third.retry_after)
    assert not any(decision.failed_open for decision in (first, second, third))
    assert client.fail_open_count == 0


def test_the_server_headers_arrive_with_the_decision(client: tollgate.Client, key: str) -> None:
    allowed = client.check([{"phone": key}])
    client.check([{"phone": key}])
    refused = client.check([{"phone": key}])

    assert header(allowed, "RateLimit-Policy") == '"otp-per-phone";q=2;w=3600'
    assert header(allowed, "RateLimit").startswith('"otp-per-phone";r=1;')
    assert header(refused, "Retry-After") == str(refused.retry_after_seconds())


def test_descriptors_are_dicts_or_lists_of_pairs(client: tollgate.Client, key: str) -> None:
    client.check([{"phone": key}])

    assert client.peek([[("phone", key)]]).remaining == 1


def test_peek_consumes_nothing(client: tollgate.Client, key: str) -> None:
    client.check([{"export_user": key}])

    first, second = client.peek([{"export_user": key}]), client.peek([{"export_user": key}])

    assert first.remaining == second.remaining == 2
    assert first.refund_token is None
    assert client.peek([{"export_user": key}], cost=3).allowed is False  # only 2 left: 3 would not pass


def test_refund_with_the_decision_gives_the_units_back_once(client: tollgate.Client, key: str) -> None:
    export = [{"export_user": key}]
    decision = client.check(export)
    assert client.peek(export).remaining == 2

    client.refund(decision, export)

    assert client.peek(export).remaining == 3
    with pytest.raises(tollgate.RefundDenied) as used_twice:
        client.refund(decision.refund_token, export)  # the token alone works too, but only once
    assert used_twice.value.code == grpc.StatusCode.PERMISSION_DENIED


def test_a_forged_token_is_denied_and_changes_nothing(client: tollgate.Client, key: str) -> None:
    export = [{"export_user": key}]
    decision = client.check(export)
    token = decision.refund_token
    forged = token[:20] + ("B" if token[20] == "A" else "A") + token[21:]

    with pytest.raises(tollgate.RefundDenied):
        client.refund(forged, export)
    with pytest.raises(tollgate.RefundDenied):
        client.refund(decision, [{"export_user": key + "-other"}])  # a real token for other descriptors

    assert client.peek(export).remaining == 2


def test_refunding_a_decision_without_token_does_nothing(client: tollgate.Client, key: str) -> None:
    client.refund(client.peek([{"export_user": key}]), [{"export_user": key}])  # no call, no error


def test_all_or_nothing_consumes_nothing_when_one_refuses(client: tollgate.Client, key: str) -> None:
    client.check([{"phone": key}], cost=2)  # the phone's hour is used up

    decision = client.check_all_or_nothing([{"export_user": key}, {"phone": key}])

    assert decision.allowed is False
    assert client.peek([{"export_user": key}]).remaining == 3


def test_a_cost_above_the_limit_is_refused_without_a_retry_hint(client: tollgate.Client, key: str) -> None:
    decision = client.check([{"export_user": key}], cost=4)

    assert decision.allowed is False
    assert decision.retry_after is None
    assert decision.retry_after_seconds() == 1  # a Retry-After still says something, and never 0


def test_a_malformed_request_raises_even_when_failing_open(client: tollgate.Client) -> None:
    with pytest.raises(tollgate.TollgateError) as error:
        client.check([])

    assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert not isinstance(error.value, tollgate.Unavailable)
    assert client.fail_open_count == 0


def test_an_unknown_domain_raises_even_when_failing_open(server: TollgateServer) -> None:
    with tollgate.Client(server.grpc, domain="tset", deadline=PATIENT_DEADLINE) as typo:
        with pytest.raises(tollgate.UnknownDomain) as error:
            typo.check([{"phone": "5550100"}])

        assert error.value.code == grpc.StatusCode.NOT_FOUND
        assert "tset" in error.value.details
        assert typo.fail_open_count == 0


def test_a_client_can_use_a_channel_of_its_own(server: TollgateServer, key: str) -> None:
    channel = grpc.insecure_channel(server.grpc)
    with tollgate.Client(domain="test", channel=channel, deadline=PATIENT_DEADLINE) as client:
        assert client.check([{"phone": key}]).remaining == 1

    # Closing the client left the channel it was given open.
    again = tollgate.Client(domain="test", channel=channel, deadline=PATIENT_DEADLINE)
    assert again.peek([{"phone": key}]).remaining == 1
    channel.close()
