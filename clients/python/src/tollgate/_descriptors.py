"""Descriptors as callers write them."""

from typing import Mapping, Sequence, Tuple, Union

Entries = Union[Mapping[str, str], Sequence[Tuple[str, str]]]
"""One descriptor: its (key, value) entries in order, as a list of pairs or a dict (whose order is its
insertion order). `[("path", "/auth/otp"), ("phone", "5550100")]` and
`{"path": "/auth/otp", "phone": "5550100"}` are the same descriptor, matched against the rules' nested
keys in that order, as Envoy's descriptors are.
"""

Descriptors = Sequence[Entries]
"""The descriptors of one request: each is checked against its own rules, e.g.
`[{"user": "42"}, {"route": "/export"}]`.
"""

Normalized = Tuple[Tuple[Tuple[str, str], ...], ...]
"""Descriptors copied into tuples, so a caller changing its list later changes nothing here."""


def normalize(descriptors: Descriptors) -> Normalized:
    """Checks the shape of `descriptors` and copies them. Raises TypeError with a hint for the usual
    slip, one descriptor passed where a list of them is expected.
    """
    if isinstance(descriptors, (str, bytes, Mapping)):
        raise TypeError(f"descriptors are a list of descriptors, got {type(descriptors).__name__}: "
                        "wrap a single descriptor in a list")
    return tuple(_entries(entries) for entries in descriptors)


def _entries(entries: Entries) -> Tuple[Tuple[str, str], ...]:
    pairs = list(entries.items()) if isinstance(entries, Mapping) else list(entries)
    if not all(_is_pair(pair) for pair in pairs):
        raise TypeError(f"a descriptor is a dict or a list of (key, value) pairs of str, got {entries!r} "
                        "(one descriptor where a list of them was expected?)")
    return tuple((key, value) for key, value in pairs)


def _is_pair(pair: object) -> bool:
    return (isinstance(pair, (tuple, list)) and len(pair) == 2
            and all(isinstance(part, str) for part in pair))
