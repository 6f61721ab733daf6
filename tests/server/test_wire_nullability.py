"""No response field is null where Kafka's broker never writes null.

Schema-driven: for every advertised (API, version) a request is built from the kio request schema
(one element in every array, names that hit existing and missing topics/groups/transactional
ids, so both success and error answers are covered), sent to the real broker, and the decoded
kio response is walked field by field. A null (None) in a wire-nullable field (string, bytes,
records, array, struct) fails unless ``KAFKA_NULLS`` lists it with the condition under which
Kafka's own response builders (KafkaApis, ReplicaManager, GroupCoordinator, ConfigHelper...)
leave it null. kio's ``None`` for uuid/timestamp fields is a decoded sentinel, not a wire null,
and is not checked.
"""

from __future__ import annotations

import dataclasses
import datetime
import typing
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from tests.support.broker import Broker
from tests.support.wire import WireClient, simple_batch

from exactly.protocol.apis import VERSION_RANGES, ApiKey, schema

pytestmark = pytest.mark.timeout(120)

# ---- what Kafka leaves null, and when ----------------------------------------------------------
# (api, dotted path) -> predicate(parent struct, request) that is True where Kafka writes null.
Allowed = Callable[[Any, Any], bool]


def _ok(parent: Any, _request: Any) -> bool:
    return int(parent.error_code) == 0


def _failed(parent: Any, _request: Any) -> bool:
    return int(parent.error_code) != 0


def _always(_parent: Any, _request: Any) -> bool:
    return True


KAFKA_NULLS: dict[tuple[ApiKey, str], Allowed] = {
    # ReplicaManager: abortedTransactions is Optional.empty (-> null) for read_uncommitted reads
    # and for every error partition; read_committed reads carry a (maybe empty) list.
    (ApiKey.FETCH, "responses.partitions.aborted_transactions"): lambda p, r: (
        int(p.error_code) != 0 or int(r.isolation_level) == 0
    ),
    # ProduceResponse.PartitionResponse.errorMessage is null unless the append failed with one.
    (ApiKey.PRODUCE, "responses.partition_responses.error_message"): _always,
    (ApiKey.PRODUCE, "node_endpoints.rack"): _always,
    # ApiError(e).message: null on success ("default": "null" or ApiError.NONE).
    (ApiKey.CREATE_TOPICS, "topics.error_message"): _ok,
    (ApiKey.CREATE_PARTITIONS, "results.error_message"): _ok,  # ApiError.NONE.message is null
    (ApiKey.CREATE_TOPICS, "topics.configs.value"): lambda p, r: bool(p.is_sensitive),
    (ApiKey.DELETE_TOPICS, "responses.error_message"): _always,  # set only by some error paths
    (ApiKey.DELETE_TOPICS, "responses.name"): lambda p, r: int(p.error_code) == ErrorCode.unknown_topic_id,
    (ApiKey.DESCRIBE_CLUSTER, "error_message"): _ok,
    (ApiKey.DESCRIBE_CLUSTER, "brokers.rack"): _always,  # broker.rack unset
    (ApiKey.METADATA, "brokers.rack"): _always,
    (ApiKey.METADATA, "topics.name"): lambda p, r: int(p.error_code) == ErrorCode.unknown_topic_id,
    # ConfigHelper: sensitive values, and values that are unset, are null
    (ApiKey.DESCRIBE_CONFIGS, "results.configs.value"): _always,
    (ApiKey.DESCRIBE_CONFIGS, "results.configs.synonyms.value"): _always,
    # Kafka writes ConfigDef's documentation when include_documentation is set (null for names
    # without a ConfigDef key); exactly has no documentation strings and always writes null - a
    # deliberate difference (notes/wire-conformance.md), and a value Kafka's clients already take.
    (ApiKey.DESCRIBE_CONFIGS, "results.configs.documentation"): _always,
    (ApiKey.DESCRIBE_PRODUCERS, "topics.partitions.error_message"): _always,
    # dynamic (non-static) members have no group.instance.id
    (ApiKey.DESCRIBE_GROUPS, "groups.members.group_instance_id"): _always,
    (ApiKey.JOIN_GROUP, "members.group_instance_id"): _always,
    (ApiKey.LEAVE_GROUP, "members.group_instance_id"): _always,
    # GroupCoordinator join/sync errors carry protocolType/protocolName None (-> null, v7+/v5+)
    (ApiKey.JOIN_GROUP, "protocol_type"): _failed,
    (ApiKey.JOIN_GROUP, "protocol_name"): _failed,
    (ApiKey.SYNC_GROUP, "protocol_type"): _failed,
    (ApiKey.SYNC_GROUP, "protocol_name"): _failed,
}

# ---- building one request of any API/version from its schema -------------------------------


@dataclass(frozen=True)
class Names:
    topic: str
    group: str
    txn: str


_BY_NAME: dict[str, Callable[[Names], Any]] = {
    "topic": lambda n: n.topic,
    "name": lambda n: n.topic,
    "topic_name": lambda n: n.topic,
    "resource_name": lambda n: n.topic,
    "group_id": lambda n: n.group,
    "groups": lambda n: n.group,
    "groups_names": lambda n: n.group,
    "key": lambda n: n.group,
    "coordinator_keys": lambda n: n.group,
    "transactional_id": lambda n: n.txn,
    "transactional_ids": lambda n: n.txn,
    "protocol_type": lambda n: "consumer",
    "client_software_name": lambda n: "wire-nulls",
    "client_software_version": lambda n: "1.0",
    "replica_id": lambda n: -1,
    "producer_id": lambda n: -1,
    "producer_epoch": lambda n: -1,
    "generation_id": lambda n: -1,
    "committed_leader_epoch": lambda n: -1,
    "current_leader_epoch": lambda n: -1,
    "last_fetched_epoch": lambda n: -1,
    "log_start_offset": lambda n: -1,
    "timestamp": lambda n: -1,
    "duration_filter": lambda n: -1,
    "acks": lambda n: -1,
    "num_partitions": lambda n: 1,
    "replication_factor": lambda n: 1,
    "resource_type": lambda n: 2,  # TOPIC
    "include_synonyms": lambda n: True,
    "include_documentation": lambda n: True,
    "max_bytes": lambda n: 1 << 20,
    "partition_max_bytes": lambda n: 1 << 20,
    "timeout": lambda n: datetime.timedelta(seconds=5),
    "timeout_ms": lambda n: datetime.timedelta(seconds=5),
    "session_timeout": lambda n: datetime.timedelta(seconds=10),
    "rebalance_timeout": lambda n: datetime.timedelta(seconds=10),
    "transaction_timeout": lambda n: datetime.timedelta(seconds=10),
    "records": lambda n: simple_batch([b"nulls"]),
}
_EMPTY = {"forgotten_topics_data", "state_filters", "producer_id_filters", "assignments", "configs"}
_NULL = {"configuration_keys", "group_instance_id", "rack_id", "cluster_id"}


def fill(cls: type[Any], names: Names, overrides: dict[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        key = f.name.removeprefix("v3_and_below_")
        if key in overrides:
            values[f.name] = overrides[key]
        elif f.name in _EMPTY:
            values[f.name] = ()
        elif f.name in _NULL and _nullable(hints[f.name]):
            values[f.name] = None
        else:
            values[f.name] = _value(f, hints[f.name], names, overrides)
    return cls(**values)


def _nullable(hint: Any) -> bool:
    return type(None) in typing.get_args(hint)


def _value(f: dataclasses.Field[Any], hint: Any, names: Names, overrides: dict[str, Any]) -> Any:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is not tuple and len(args) == 1 and _nullable(hint):
        hint = args[0]
    if typing.get_origin(hint) is tuple:
        (element, _) = typing.get_args(hint)
        if dataclasses.is_dataclass(element):
            return (fill(element, names, overrides),)  # type: ignore[arg-type]
        return (_scalar(f, element, names, element=True),)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return fill(hint, names, overrides)
    return _scalar(f, hint, names)


def _scalar(f: dataclasses.Field[Any], hint: Any, names: Names, *, element: bool = False) -> Any:
    key = f.name.removeprefix("v3_and_below_")  # AddPartitionsToTxn v4 renamed the v0-v3 fields
    if key in _BY_NAME:
        return _BY_NAME[key](names)
    kafka_type = f.metadata.get("kafka_type")
    if f.default is not dataclasses.MISSING and not element:
        return f.default
    if kafka_type == "string":
        return ""
    if kafka_type == "bool":
        return False
    if kafka_type == "uuid":
        return uuid.UUID(int=0)
    if kafka_type in ("bytes", "records"):
        return b""
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(0)
    return 0


# ---- walking a response ----------------------------------------------------------------------
_NOT_WIRE_NULL = {"uuid", "datetime_i64", "timedelta_i32", "timedelta_i64"}


def nulls(entity: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, parent struct) of every wire-null field under ``entity``."""
    for f in dataclasses.fields(entity):
        value = getattr(entity, f.name)
        here = f"{path}{f.name}"
        if value is None:
            if f.metadata.get("kafka_type") not in _NOT_WIRE_NULL:
                yield here, entity
        elif isinstance(value, tuple):
            for item in value:
                if dataclasses.is_dataclass(item):
                    yield from nulls(item, here + ".")
        elif dataclasses.is_dataclass(value):
            yield from nulls(value, here + ".")


# ---- the test ----------------------------------------------------------------------------------
def _advertised() -> list[tuple[ApiKey, int]]:
    return [(ApiKey(k), v) for k, (lo, hi) in sorted(VERSION_RANGES.items()) for v in range(lo, hi + 1)]


GROWN_TOPIC = "nulls-grown"


@pytest.fixture(scope="module")
def existing(_session_broker: Broker) -> Names:
    """A topic with records, a group with a committed offset, a transactional id with a producer id."""
    names = Names(topic="nulls-topic", group="nulls-group", txn="nulls-txn")
    with WireClient(_session_broker.bootstrap) as c:
        for api, version in ((ApiKey.CREATE_TOPICS, 5), (ApiKey.PRODUCE, 9), (ApiKey.OFFSET_COMMIT, 8)):
            response = c.send(fill(schema(api, version).request_type, names, {}))
        grown = dataclasses.replace(names, topic=GROWN_TOPIC)  # CreatePartitions grows it per version
        c.send(fill(schema(ApiKey.CREATE_TOPICS, 5).request_type, grown, {}))
        # an open transaction (Empty has start time -1, which kio's decoder refuses)
        timeout = {"transaction_timeout": datetime.timedelta(minutes=5)}
        pid = c.send(fill(schema(ApiKey.INIT_PRODUCER_ID, 4).request_type, names, timeout))
        assert pid.error_code == 0
        ids = {"producer_id": pid.producer_id, "producer_epoch": pid.producer_epoch}
        response = c.send(fill(schema(ApiKey.ADD_PARTITIONS_TO_TXN, 3).request_type, names, ids))
        assert response.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == 0, (
            response
        )
    return names


def _scenarios(api: ApiKey, version: int, names: Names) -> list[tuple[str, Names, dict[str, Any]]]:
    missing = Names(topic="nulls-no-such-topic", group="nulls-no-such-group", txn="nulls-no-such-txn")
    if api == ApiKey.CREATE_TOPICS:  # a new topic (success) and the existing one (TOPIC_ALREADY_EXISTS)
        fresh = dataclasses.replace(names, topic=f"nulls-new-{uuid.uuid4().hex[:8]}")
        return [("new", fresh, {}), ("exists", names, {})]
    if api == ApiKey.INIT_PRODUCER_ID:
        # own ids: the fixture's would have its open transaction aborted, a "missing" one would
        # exist afterwards in state Empty, whose start time -1 kio cannot decode
        own = dataclasses.replace(names, txn=f"nulls-init-{uuid.uuid4().hex[:8]}")
        return [("transactional", own, {}), ("idempotent", names, {"transactional_id": None})]
    if api in (ApiKey.DELETE_TOPICS, ApiKey.DELETE_GROUPS, ApiKey.WRITE_TXN_MARKERS):
        return [("missing", missing, {})]  # never delete or mark the shared fixtures
    out = [("existing", names, {}), ("missing", missing, {})]
    if api == ApiKey.FETCH:
        out += [
            ("existing-committed", names, {"isolation_level": 1}),
            ("beyond-end", names, {"fetch_offset": 99}),
        ]
    if api == ApiKey.METADATA:
        out.append(("all-topics", names, {"topics": None}))
    if api == ApiKey.CREATE_PARTITIONS:  # the filler's count 0 only reaches INVALID_PARTITIONS
        grown = dataclasses.replace(names, topic=GROWN_TOPIC)
        out.append(("grow", grown, {"count": version + 2, "assignments": None}))
    return out


@pytest.mark.parametrize(("api", "version"), _advertised(), ids=lambda x: str(getattr(x, "name", x)))
def test_no_null_where_kafka_writes_none(broker: Broker, existing: Names, api: ApiKey, version: int) -> None:
    request_type = schema(api, version).request_type
    problems: list[str] = []
    with WireClient(broker.bootstrap) as c:
        for label, names, overrides in _scenarios(api, version, existing):
            request = fill(request_type, names, overrides)
            response = c.send(request)
            for path, parent in nulls(response):
                allowed = KAFKA_NULLS.get((api, path))
                if allowed is None or not allowed(parent, request):
                    problems.append(f"{label}: {path} is null ({_context(parent)})")
    assert not problems, f"{api.name} v{version}:\n" + "\n".join(problems)


def _context(parent: Any) -> str:
    code = getattr(parent, "error_code", None)
    return (
        f"{type(parent).__name__}, error_code={ErrorCode(code).name}"
        if code is not None
        else type(parent).__name__
    )
