"""The API table: which (api key, version) pairs the broker speaks, and their kio schemas.

Why a table: ApiVersions must advertise exactly what the dispatcher accepts, so both come from
one place. Versions are capped where kio has no schema, or where a newer version changes
semantics we have not built yet (for example Fetch v13+ addresses topics by id).

``build(cls, **fields)`` constructs a kio dataclass of any version from the union of fields a
handler knows: fields the version lacks are dropped, fields the handler did not give get their
schema default or a zero value. That lets one handler serve every version of its API. The zero
values are those of Kafka's generated message classes: "" for a string and an empty array even
where the field is nullable; null only where the schema's default is null (kio carries that
default), so a field a handler leaves out goes on the wire as Kafka's broker would write it.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import functools
import io
import types
import typing
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from kio.index import load_payload_module
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType


class ApiKey(enum.IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    WRITE_TXN_MARKERS = 27
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DESCRIBE_CONFIGS = 32
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66


# (min, max) versions the broker accepts and ApiVersions advertises, capped to what the handlers
# implement. Every key here has a handler and every handler a key: the handler registry
# (exactly.server.handlers) refuses to import otherwise.
VERSION_RANGES: dict[int, tuple[int, int]] = {
    ApiKey.PRODUCE: (3, 11),
    ApiKey.FETCH: (4, 12),
    ApiKey.LIST_OFFSETS: (1, 7),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: (2, 4),  # v2: librdkafka's only version (KIP-320)
    ApiKey.METADATA: (0, 12),
    ApiKey.OFFSET_COMMIT: (2, 8),
    ApiKey.OFFSET_FETCH: (1, 8),
    ApiKey.FIND_COORDINATOR: (0, 5),
    ApiKey.JOIN_GROUP: (0, 9),
    ApiKey.HEARTBEAT: (0, 4),
    ApiKey.LEAVE_GROUP: (0, 5),
    ApiKey.SYNC_GROUP: (0, 5),
    ApiKey.DESCRIBE_GROUPS: (0, 5),
    ApiKey.LIST_GROUPS: (0, 4),
    ApiKey.API_VERSIONS: (0, 4),
    ApiKey.CREATE_TOPICS: (2, 7),
    ApiKey.DELETE_TOPICS: (1, 6),
    ApiKey.DELETE_RECORDS: (0, 2),
    ApiKey.INIT_PRODUCER_ID: (0, 6),
    ApiKey.ADD_PARTITIONS_TO_TXN: (0, 5),
    ApiKey.ADD_OFFSETS_TO_TXN: (0, 4),
    ApiKey.END_TXN: (0, 4),
    ApiKey.WRITE_TXN_MARKERS: (1, 1),
    ApiKey.TXN_OFFSET_COMMIT: (0, 4),
    ApiKey.DESCRIBE_ACLS: (1, 3),  # kio has no v0 schema; v1 adds the pattern type (KIP-290)
    ApiKey.CREATE_ACLS: (1, 3),
    ApiKey.DELETE_ACLS: (1, 3),
    ApiKey.DESCRIBE_CONFIGS: (1, 4),
    ApiKey.CREATE_PARTITIONS: (0, 3),
    ApiKey.DELETE_GROUPS: (0, 2),
    ApiKey.SASL_HANDSHAKE: (0, 1),  # never flexible (KAFKA-9577)
    ApiKey.SASL_AUTHENTICATE: (0, 2),
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0),
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: (0, 0),
    ApiKey.DESCRIBE_CLUSTER: (0, 1),
    ApiKey.DESCRIBE_PRODUCERS: (0, 0),
    ApiKey.DESCRIBE_TRANSACTIONS: (0, 0),
    ApiKey.LIST_TRANSACTIONS: (0, 1),
}


def supported_apis() -> list[tuple[int, tuple[int, int]]]:
    """(api key, (min, max)) of every API we speak, by key: what ApiVersions advertises."""
    return [(int(k), VERSION_RANGES[k]) for k in sorted(VERSION_RANGES)]


@dataclass(frozen=True, slots=True)
class ApiSchema:
    api_key: int
    version: int
    request_module: types.ModuleType
    response_module: types.ModuleType
    request_type: type[Any]
    response_type: type[Any]
    request_flexible: bool
    response_flexible: bool
    read_request: Callable[[bytes | bytearray, int], tuple[Any, int]]
    write_response: Callable[[io.BytesIO, Any], None]


@cache
def schema(api_key: int, version: int) -> ApiSchema:
    req_mod = load_payload_module(api_key, version, EntityType.request)
    resp_mod = load_payload_module(api_key, version, EntityType.response)
    req_type = _payload_class(req_mod, EntityType.request)
    resp_type = _payload_class(resp_mod, EntityType.response)
    return ApiSchema(
        api_key=api_key,
        version=version,
        request_module=req_mod,
        response_module=resp_mod,
        request_type=req_type,
        response_type=resp_type,
        request_flexible=bool(req_type.__flexible__),
        response_flexible=bool(resp_type.__flexible__),
        read_request=entity_reader(req_type),
        write_response=entity_writer(resp_type),
    )


def _payload_class(module: types.ModuleType, kind: EntityType) -> type[Any]:
    for value in vars(module).values():
        if isinstance(value, type) and getattr(value, "__type__", None) == kind:
            return value
    raise LookupError(f"no {kind.name} class in {module.__name__}")


def encode_response(api: ApiSchema, response: Any) -> bytes:
    out = io.BytesIO()
    api.write_response(out, response)
    return out.getvalue()


# ---- building responses for any version -----------------------------------------------------

_ZERO_BY_KAFKA_TYPE: dict[str, Any] = {
    "int8": 0,
    "int16": 0,
    "int32": 0,
    "int64": 0,
    "uint16": 0,
    "uint32": 0,
    "float64": 0.0,
    "bool": False,
    "string": "",
    "bytes": b"",
    "records": None,
    "error_code": 0,
    "timedelta_i32": datetime.timedelta(0),
    "timedelta_i64": datetime.timedelta(0),
    "datetime_i64": None,
}


def _const(value: Any) -> Any:
    return value


_PLANS: dict[type[Any], tuple[tuple[str, Callable[[], Any]], ...]] = {}


def _field_plan(cls: type[Any]) -> tuple[tuple[str, Callable[[], Any]], ...]:
    """For each field of ``cls``: its name and a factory for its value when not given."""
    plan = _PLANS.get(cls)
    if plan is None:
        plan = _PLANS[cls] = _make_plan(cls)
    return plan


def _make_plan(cls: type[Any]) -> tuple[tuple[str, Callable[[], Any]], ...]:
    hints = typing.get_type_hints(cls)
    plan: list[tuple[str, Callable[[], Any]]] = []
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default = f.default
            plan.append((f.name, functools.partial(_const, default)))
            continue
        if f.default_factory is not dataclasses.MISSING:
            plan.append((f.name, f.default_factory))
            continue
        kafka_type = f.metadata.get("kafka_type")
        if kafka_type is not None:
            zero = _ZERO_BY_KAFKA_TYPE.get(kafka_type)
            if kafka_type == "uuid":
                zero = uuid.UUID(int=0)
            plan.append((f.name, functools.partial(_const, zero)))
            continue
        hint = hints[f.name]
        origin = typing.get_origin(hint)
        if origin is tuple or any(typing.get_origin(a) is tuple for a in typing.get_args(hint)):
            # a nullable array without a null default starts empty in Kafka's generated
            # messages too, so a field a handler leaves out is never written as null
            plan.append((f.name, tuple))
        elif isinstance(hint, type) and dataclasses.is_dataclass(hint):
            plan.append((f.name, functools.partial(build, hint)))
        elif (struct := _nullable_struct(hint)) is not None:
            plan.append((f.name, functools.partial(build, struct)))
        else:
            plan.append((f.name, functools.partial(_const, None)))
    return tuple(plan)


def _nullable_struct(hint: Any) -> type[Any] | None:
    for arg in typing.get_args(hint):
        if isinstance(arg, type) and dataclasses.is_dataclass(arg):
            return arg
    return None


def build(cls: type[Any], **values: Any) -> Any:
    """Instantiate kio dataclass ``cls`` from the fields it has; see the module docstring."""
    kwargs: dict[str, Any] = {}
    for name, factory in _field_plan(cls):
        if name in values:
            kwargs[name] = values[name]
        else:
            kwargs[name] = factory()
    return cls(**kwargs)
