"""What the client decides without a server: descriptor shapes, argument checks, rounding, and what
the installed package ships.
"""

import importlib.resources

import pytest

import tollgate


def test_a_single_descriptor_where_a_list_is_expected_is_a_type_error() -> None:
    client = tollgate.Client(domain="test")

    for wrong in ({"phone": "5550100"}, [("phone", "5550100")], ["phone"], [{"phone": 5550100}]):
        with pytest.raises(TypeError):
            client.check(wrong)  # type: ignore[arg-type]
    client.close()


def test_the_arguments_are_checked() -> None:
    with pytest.raises(ValueError):
        tollgate.Client(domain="")
    with pytest.raises(ValueError):
        tollgate.Client(domain="test", deadline=0)
    with pytest.raises(ValueError):
        tollgate.Client(domain="test", failure="sometimes")  # type: ignore[arg-type]


@pytest.mark.parametrize(("retry_after", "header"), [(None, 1), (0.0, 1), (0.2, 1), (1.0, 1), (1.000001, 2),
                                                     (3599.99, 3600)])
def test_retry_after_seconds_rounds_up_to_at_least_one(retry_after: float, header: int) -> None:
    assert tollgate.Decision(allowed=False, retry_after=retry_after).retry_after_seconds() == header


def test_the_package_ships_its_type_information() -> None:
    package = importlib.resources.files("tollgate")

    assert (package / "py.typed").is_file()
    assert (package / "v1" / "ratelimiter_pb2.pyi").is_file()
