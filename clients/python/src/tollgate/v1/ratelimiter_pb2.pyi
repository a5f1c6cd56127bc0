import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODE_CONSUME: _ClassVar[Mode]
    MODE_PEEK: _ClassVar[Mode]
    MODE_ALL_OR_NOTHING: _ClassVar[Mode]
MODE_CONSUME: Mode
MODE_PEEK: Mode
MODE_ALL_OR_NOTHING: Mode

class Entry(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class Descriptor(_message.Message):
    __slots__ = ("entries", "cost")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[Entry]
    cost: int
    def __init__(self, entries: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ..., cost: _Optional[int] = ...) -> None: ...

class CheckRequest(_message.Message):
    __slots__ = ("domain", "descriptors", "cost", "mode")
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTORS_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    domain: str
    descriptors: _containers.RepeatedCompositeFieldContainer[Descriptor]
    cost: int
    mode: Mode
    def __init__(self, domain: _Optional[str] = ..., descriptors: _Optional[_Iterable[_Union[Descriptor, _Mapping]]] = ..., cost: _Optional[int] = ..., mode: _Optional[_Union[Mode, str]] = ...) -> None: ...

class Limit(_message.Message):
    __slots__ = ("rule", "name", "algorithm", "requests_per_unit", "unit", "window", "burst")
    RULE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_PER_UNIT_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    BURST_FIELD_NUMBER: _ClassVar[int]
    rule: str
    name: str
    algorithm: str
    requests_per_unit: int
    unit: str
    window: _duration_pb2.Duration
    burst: int
    def __init__(self, rule: _Optional[str] = ..., name: _Optional[str] = ..., algorithm: _Optional[str] = ..., requests_per_unit: _Optional[int] = ..., unit: _Optional[str] = ..., window: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., burst: _Optional[int] = ...) -> None: ...

class CheckResult(_message.Message):
    __slots__ = ("allowed", "limit", "remaining", "reset_after", "retry_after", "shadow", "unlimited", "failure_mode_applied")
    ALLOWED_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    REMAINING_FIELD_NUMBER: _ClassVar[int]
    RESET_AFTER_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    SHADOW_FIELD_NUMBER: _ClassVar[int]
    UNLIMITED_FIELD_NUMBER: _ClassVar[int]
    FAILURE_MODE_APPLIED_FIELD_NUMBER: _ClassVar[int]
    allowed: bool
    limit: Limit
    remaining: int
    reset_after: _duration_pb2.Duration
    retry_after: _duration_pb2.Duration
    shadow: bool
    unlimited: bool
    failure_mode_applied: bool
    def __init__(self, allowed: bool = ..., limit: _Optional[_Union[Limit, _Mapping]] = ..., remaining: _Optional[int] = ..., reset_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., retry_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., shadow: bool = ..., unlimited: bool = ..., failure_mode_applied: bool = ...) -> None: ...

class CheckResponse(_message.Message):
    __slots__ = ("allowed", "results", "retry_after", "headers", "refund_token")
    ALLOWED_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    REFUND_TOKEN_FIELD_NUMBER: _ClassVar[int]
    allowed: bool
    results: _containers.RepeatedCompositeFieldContainer[CheckResult]
    retry_after: _duration_pb2.Duration
    headers: _containers.RepeatedCompositeFieldContainer[Header]
    refund_token: str
    def __init__(self, allowed: bool = ..., results: _Optional[_Iterable[_Union[CheckResult, _Mapping]]] = ..., retry_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., headers: _Optional[_Iterable[_Union[Header, _Mapping]]] = ..., refund_token: _Optional[str] = ...) -> None: ...

class Header(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class RefundRequest(_message.Message):
    __slots__ = ("domain", "descriptors", "cost", "refund_token")
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTORS_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    REFUND_TOKEN_FIELD_NUMBER: _ClassVar[int]
    domain: str
    descriptors: _containers.RepeatedCompositeFieldContainer[Descriptor]
    cost: int
    refund_token: str
    def __init__(self, domain: _Optional[str] = ..., descriptors: _Optional[_Iterable[_Union[Descriptor, _Mapping]]] = ..., cost: _Optional[int] = ..., refund_token: _Optional[str] = ...) -> None: ...

class RefundResult(_message.Message):
    __slots__ = ("limit", "remaining", "reset_after")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    REMAINING_FIELD_NUMBER: _ClassVar[int]
    RESET_AFTER_FIELD_NUMBER: _ClassVar[int]
    limit: Limit
    remaining: int
    reset_after: _duration_pb2.Duration
    def __init__(self, limit: _Optional[_Union[Limit, _Mapping]] = ..., remaining: _Optional[int] = ..., reset_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class RefundResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[RefundResult]
    def __init__(self, results: _Optional[_Iterable[_Union[RefundResult, _Mapping]]] = ...) -> None: ...

class AcquireRequest(_message.Message):
    __slots__ = ("domain", "descriptors", "lease_id", "ttl")
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTORS_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    domain: str
    descriptors: _containers.RepeatedCompositeFieldContainer[Descriptor]
    lease_id: str
    ttl: _duration_pb2.Duration
    def __init__(self, domain: _Optional[str] = ..., descriptors: _Optional[_Iterable[_Union[Descriptor, _Mapping]]] = ..., lease_id: _Optional[str] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class LeaseResult(_message.Message):
    __slots__ = ("acquired", "rule", "max_in_flight", "in_flight", "retry_after", "failure_mode_applied")
    ACQUIRED_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    FAILURE_MODE_APPLIED_FIELD_NUMBER: _ClassVar[int]
    acquired: bool
    rule: str
    max_in_flight: int
    in_flight: int
    retry_after: _duration_pb2.Duration
    failure_mode_applied: bool
    def __init__(self, acquired: bool = ..., rule: _Optional[str] = ..., max_in_flight: _Optional[int] = ..., in_flight: _Optional[int] = ..., retry_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., failure_mode_applied: bool = ...) -> None: ...

class AcquireResponse(_message.Message):
    __slots__ = ("acquired", "lease_id", "ttl", "results", "retry_after")
    ACQUIRED_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    acquired: bool
    lease_id: str
    ttl: _duration_pb2.Duration
    results: _containers.RepeatedCompositeFieldContainer[LeaseResult]
    retry_after: _duration_pb2.Duration
    def __init__(self, acquired: bool = ..., lease_id: _Optional[str] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., results: _Optional[_Iterable[_Union[LeaseResult, _Mapping]]] = ..., retry_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("domain", "descriptors", "lease_id")
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTORS_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    domain: str
    descriptors: _containers.RepeatedCompositeFieldContainer[Descriptor]
    lease_id: str
    def __init__(self, domain: _Optional[str] = ..., descriptors: _Optional[_Iterable[_Union[Descriptor, _Mapping]]] = ..., lease_id: _Optional[str] = ...) -> None: ...

class ReleaseResult(_message.Message):
    __slots__ = ("released", "in_flight")
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    released: bool
    in_flight: int
    def __init__(self, released: bool = ..., in_flight: _Optional[int] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ReleaseResult]
    def __init__(self, results: _Optional[_Iterable[_Union[ReleaseResult, _Mapping]]] = ...) -> None: ...
