"""Each planned API answers at the old and new versions real clients use (flexible and not)."""

from __future__ import annotations

import importlib
import time
from typing import Any

import pytest
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i8, i32, i64

from tests.support.broker import Broker
from tests.support.wire import (
    WireClient,
    create_topic,
    encode_request,
    fetch_records,
    fetch_request,
    partition_response,
    produce_request,
    simple_batch,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def filled(broker: Broker, topic: str) -> str:
    """A topic with 10 records (two batches)."""
    with WireClient(broker.bootstrap) as c:
        assert create_topic(c, topic).error_code == 0
        for chunk in (range(4), range(4, 10)):
            part = partition_response(
                c.send(produce_request(topic, 0, simple_batch([f"v{i}".encode() for i in chunk])))
            )
            assert part.error_code == 0
    return topic


@pytest.mark.parametrize("version", [3, 5, 7, 8, 9, 10])
def test_produce_versions(broker: Broker, topic: str, version: int) -> None:
    with WireClient(broker.bootstrap) as c:
        assert create_topic(c, topic).error_code == 0
        for expected in (0, 2):
            part = partition_response(
                c.send(produce_request(topic, 0, simple_batch([b"a", b"b"]), version=version))
            )
            assert part.error_code == 0
            assert int(part.base_offset) == expected
        assert [r.value for r in fetch_records(c, topic)] == [b"a", b"b", b"a", b"b"]


@pytest.mark.parametrize("version", [4, 5, 7, 11, 12])
def test_fetch_versions(broker: Broker, filled: str, version: int) -> None:
    with WireClient(broker.bootstrap) as c:
        assert [r.value for r in fetch_records(c, filled, version=version)] == [
            f"v{i}".encode() for i in range(10)
        ]
        # from the middle of a batch: Kafka returns the whole batch, the client skips the head
        records = fetch_records(c, filled, offset=6, version=version)
        assert [r.offset for r in records] == [6, 7, 8, 9]
        resp = c.send(fetch_request(filled, 0, 10, version=version))
        (t,) = resp.responses
        (p,) = t.partitions
        assert p.error_code == 0 and int(p.high_watermark) == 10 and not p.records


def test_fetch_out_of_range_and_long_poll(broker: Broker, filled: str) -> None:
    with WireClient(broker.bootstrap) as c:
        (t,) = c.send(fetch_request(filled, 0, 11)).responses
        assert t.partitions[0].error_code == 1  # OFFSET_OUT_OF_RANGE
        start = time.monotonic()
        (t,) = c.send(fetch_request(filled, 0, 10, max_wait_ms=700, min_bytes=1)).responses
        waited = time.monotonic() - start
        assert t.partitions[0].error_code == 0 and not t.partitions[0].records
        assert 0.5 <= waited < 5, f"long poll with nothing to read returned after {waited:.2f}s"


@pytest.mark.parametrize("version", [1, 4, 7, 9, 12])
def test_metadata_versions(broker: Broker, filled: str, version: int) -> None:
    mod: Any = importlib.import_module(f"kio.schema.metadata.v{version}.request")
    fields = {f for f in mod.MetadataRequestTopic.__dataclass_fields__}
    topic_entry = mod.MetadataRequestTopic(
        name=TopicName(filled), **({"topic_id": None} if "topic_id" in fields else {})
    )
    kwargs: dict[str, Any] = {"topics": (topic_entry,)}
    req_fields = set(mod.MetadataRequest.__dataclass_fields__)
    if "allow_auto_topic_creation" in req_fields:
        kwargs["allow_auto_topic_creation"] = False
    for flag in ("include_topic_authorized_operations", "include_cluster_authorized_operations"):
        if flag in req_fields:
            kwargs[flag] = False
    with WireClient(broker.bootstrap) as c:
        md = c.send(mod.MetadataRequest(**kwargs))
    (b,) = md.brokers
    assert (b.host, int(b.port)) == (broker.host, broker.port)
    (t,) = md.topics
    assert t.name == filled and t.error_code == 0
    (p,) = t.partitions
    assert int(p.leader_id) == int(b.node_id)


def test_metadata_by_topic_id(broker: Broker, filled: str) -> None:
    """v12 looks topics up by id (null name); an unknown or zero id gets UNKNOWN_TOPIC_ID (100)."""
    import uuid

    from kio.schema.metadata.v12 import request as v12

    def ask(entries: tuple[Any, ...]) -> Any:
        with WireClient(broker.bootstrap) as c:
            return c.send(
                v12.MetadataRequest(
                    topics=entries,
                    allow_auto_topic_creation=False,
                    include_topic_authorized_operations=False,
                )
            )

    (known,) = ask((v12.MetadataRequestTopic(topic_id=None, name=TopicName(filled)),)).topics
    assert known.error_code == 0 and known.topic_id.int != 0
    stranger = uuid.uuid4()
    by_id, unknown, zero = ask(
        (
            v12.MetadataRequestTopic(topic_id=known.topic_id, name=None),
            v12.MetadataRequestTopic(topic_id=stranger, name=None),
            v12.MetadataRequestTopic(topic_id=None, name=None),
        )
    ).topics
    assert (by_id.name, by_id.error_code, len(by_id.partitions)) == (filled, 0, 1)
    assert (unknown.topic_id, unknown.error_code) == (stranger, 100)
    assert zero.error_code == 100


def test_metadata_null_topic_name_before_v12_closes_the_connection(broker: Broker) -> None:
    from kio.schema.metadata.v11 import request as v11

    with WireClient(broker.bootstrap) as c:
        c.send_frame(
            encode_request(
                v11.MetadataRequest(
                    topics=(v11.MetadataRequestTopic(topic_id=None, name=None),),
                    allow_auto_topic_creation=False,
                    include_topic_authorized_operations=False,
                ),
                c.next_correlation_id(),
            )
        )
        assert c.is_closed()
    with WireClient(broker.bootstrap) as c:  # others are still served
        assert create_topic(c, "after-null-name").error_code == 0


@pytest.mark.parametrize("version", [1, 2, 4, 7])
def test_list_offsets_versions(broker: Broker, filled: str, version: int) -> None:
    mod: Any = importlib.import_module(f"kio.schema.list_offsets.v{version}.request")

    def lookup(ts: int) -> int:
        part = mod.ListOffsetsPartition(partition_index=i32(0), timestamp=i64(ts))
        kwargs: dict[str, Any] = {
            "replica_id": BrokerId(-1),
            "topics": (mod.ListOffsetsTopic(name=TopicName(filled), partitions=(part,)),),
        }
        if "isolation_level" in mod.ListOffsetsRequest.__dataclass_fields__:
            kwargs["isolation_level"] = i8(0)
        with WireClient(broker.bootstrap) as c:
            (t,) = c.send(mod.ListOffsetsRequest(**kwargs)).topics
        (p,) = t.partitions
        assert p.error_code == 0
        return int(p.offset)

    assert lookup(-2) == 0  # earliest
    assert lookup(-1) == 10  # latest
    assert lookup(0) == 0  # first record with timestamp >= 0


def test_describe_cluster(broker: Broker) -> None:
    from kio.schema.describe_cluster.v0.request import DescribeClusterRequest

    with WireClient(broker.bootstrap) as c:
        resp = c.send(DescribeClusterRequest(include_cluster_authorized_operations=False))
    assert resp.error_code == 0
    (b,) = resp.brokers
    assert (b.host, int(b.port)) == (broker.host, broker.port)
    assert int(resp.controller_id) == int(b.broker_id)
    assert resp.cluster_id
