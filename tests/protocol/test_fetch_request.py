"""encode_replica_fetch writes exactly what kio's generic writer writes for the same request."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from kio.schema.fetch.v11 import request as v11
from kio.schema.fetch.v12 import request as v12
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i8, i32, i32Timedelta, i64

from exactly.client.wire import encode_request
from exactly.protocol.fetch_request import FetchPosition, ReplicaFetchTemplate, encode_replica_fetch

TOPICS = [
    ("orders", [FetchPosition(0, 3, 1234, 10, 1_048_576, 2), FetchPosition(5, 3, 0, 0, 65_536, -1)]),
    ("ü-topic", [FetchPosition(1, 0, 2**40, 2**33, 1, 7)]),
]


def kio_request(version: int, topics: list[tuple[str, list[FetchPosition]]]) -> Any:
    schema: Any = v11 if version == 11 else v12
    parts: dict[str, Any] = {}
    return schema.FetchRequest(
        replica_id=BrokerId(2),
        max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=500)),
        min_bytes=i32(1),
        max_bytes=i32(10_485_760),
        isolation_level=i8(0),
        session_id=i32(0),
        session_epoch=i32(-1),
        topics=tuple(
            schema.FetchTopic(
                topic=TopicName(name),
                partitions=tuple(
                    schema.FetchPartition(
                        partition=i32(p.partition),
                        current_leader_epoch=i32(p.current_leader_epoch),
                        fetch_offset=i64(p.fetch_offset),
                        log_start_offset=i64(p.log_start_offset),
                        partition_max_bytes=i32(p.partition_max_bytes),
                        **({"last_fetched_epoch": i32(p.last_fetched_epoch)} if version == 12 else parts),
                    )
                    for p in positions
                ),
            )
            for name, positions in topics
        ),
        forgotten_topics_data=(),
        rack_id="",
    )


@pytest.mark.parametrize("version", [11, 12])
@pytest.mark.parametrize("topics", [TOPICS, []])
def test_same_bytes_as_kio(version: int, topics: list[tuple[str, list[FetchPosition]]]) -> None:
    ours = encode_replica_fetch(
        version,
        77,
        "replica-2",
        replica_id=2,
        max_wait_ms=500,
        min_bytes=1,
        max_bytes=10_485_760,
        topics=topics,
    )
    assert ours == encode_request(kio_request(version, topics), 77, "replica-2")


def test_other_versions_are_refused() -> None:
    with pytest.raises(ValueError, match="v13"):
        encode_replica_fetch(13, 1, "x", replica_id=1, max_wait_ms=1, min_bytes=1, max_bytes=1, topics=[])


@pytest.mark.parametrize("version", [11, 12])
def test_template_fill_writes_what_the_encoder_writes(version: int) -> None:
    options: dict[str, Any] = {"replica_id": 2, "max_wait_ms": 500, "min_bytes": 1, "max_bytes": 10_485_760}
    template = ReplicaFetchTemplate.build(version, "replica-2", topics=TOPICS, **options)
    moves = [(0, -1, 0), (2**40 + 1, 9, 2**33 - 1), (77, 3, 5)]
    for correlation in (1, 2**31 - 1):
        for shift in range(3):
            moved = [
                (
                    name,
                    [
                        FetchPosition(
                            p.partition, p.current_leader_epoch, m[0], m[2], p.partition_max_bytes, m[1]
                        )
                        for p, m in zip(parts, moves[shift:] + moves[:shift], strict=False)
                    ],
                )
                for name, parts in TOPICS
            ]
            flat = [(p.fetch_offset, p.last_fetched_epoch, p.log_start_offset) for _, ps in moved for p in ps]
            expected = encode_replica_fetch(version, correlation, "replica-2", topics=moved, **options)
            assert template.fill(correlation, flat) == expected
