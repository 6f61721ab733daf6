"""parse_fetch_request reads what kio's generic reader reads, for every Fetch version we serve,
and refuses every truncated request."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from kio.static.primitive import i32Timedelta

from exactly.client.wire import encode_request
from exactly.protocol.apis import VERSION_RANGES, ApiKey, build, schema
from exactly.protocol.fetch_request_reader import parse_fetch_request
from exactly.protocol.header import parse_request_header, skip_tagged_fields
from exactly.protocol.primitives import WireFormatError

LO, HI = VERSION_RANGES[ApiKey.FETCH]
VERSIONS = list(range(LO, HI + 1))


def kio_request(
    version: int, topics: list[tuple[str, list[int]]], forgotten: list[tuple[str, list[int]]]
) -> Any:
    mod = schema(ApiKey.FETCH, version).request_module
    return build(
        mod.FetchRequest,
        replica_id=3,
        max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=481)),
        min_bytes=7,
        max_bytes=10_485_760,
        isolation_level=1,
        session_id=11,
        session_epoch=-1,
        topics=tuple(
            build(
                mod.FetchTopic,
                topic=name,
                partitions=tuple(
                    build(
                        mod.FetchPartition,
                        partition=p,
                        current_leader_epoch=p + 100,
                        fetch_offset=2**40 + p,
                        last_fetched_epoch=p + 50,
                        log_start_offset=2**33 + p,
                        partition_max_bytes=65_536 + p,
                    )
                    for p in parts
                ),
            )
            for name, parts in topics
        ),
        forgotten_topics_data=tuple(  # v7+
            build(mod.ForgottenTopic, topic=name, partitions=tuple(parts))
            for name, parts in (forgotten if version >= 7 else [])
        ),
        rack_id="rack-ü",
    )


def body(version: int, request: Any) -> tuple[bytearray, int]:
    payload = bytearray(encode_request(request, 9, "client")[4:])
    _header, pos = parse_request_header(payload)
    if version >= 12:
        pos = skip_tagged_fields(payload, pos)
    return payload, pos


CASES = [
    ([("orders", [0, 5]), ("ü-topic", [2])], [("gone", [1, 4])]),
    ([], []),
]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(("topics", "forgotten"), CASES)
def test_reads_what_kio_reads(
    version: int, topics: list[tuple[str, list[int]]], forgotten: list[tuple[str, list[int]]]
) -> None:
    payload, pos = body(version, kio_request(version, topics, forgotten))
    theirs, _size = schema(ApiKey.FETCH, version).read_request(bytes(payload), pos)
    ours = parse_fetch_request(payload, pos, version)
    assert ours.replica_id == theirs.replica_id
    assert ours.max_wait == theirs.max_wait == datetime.timedelta(milliseconds=481)
    assert (ours.min_bytes, ours.max_bytes, ours.isolation_level) == (
        theirs.min_bytes,
        theirs.max_bytes,
        theirs.isolation_level,
    )
    assert (ours.session_id, ours.session_epoch) == (
        getattr(theirs, "session_id", 0),
        getattr(theirs, "session_epoch", -1),
    )
    assert [t.topic for t in ours.topics] == [t.topic for t in theirs.topics]
    for mine, kio_topic in zip(ours.topics, theirs.topics, strict=True):
        for p, q in zip(mine.partitions, kio_topic.partitions, strict=True):
            assert (p.partition, p.fetch_offset, p.partition_max_bytes) == (
                q.partition,
                q.fetch_offset,
                q.partition_max_bytes,
            )
            assert p.current_leader_epoch == getattr(q, "current_leader_epoch", -1)
            assert p.last_fetched_epoch == getattr(q, "last_fetched_epoch", -1)
            assert p.log_start_offset == getattr(q, "log_start_offset", -1)
    kio_forgotten = getattr(theirs, "forgotten_topics_data", ())
    assert [(f.topic, f.partitions) for f in ours.forgotten_topics_data] == [
        (f.topic, tuple(f.partitions)) for f in kio_forgotten
    ]
    assert ours.rack_id == getattr(theirs, "rack_id", "")


@pytest.mark.parametrize("version", VERSIONS)
def test_every_truncation_is_refused(version: int) -> None:
    payload, pos = body(version, kio_request(version, *CASES[0]))
    for cut in range(pos, len(payload)):
        with pytest.raises(WireFormatError):
            parse_fetch_request(payload[:cut], pos, version)


def test_an_array_longer_than_the_request_is_refused_before_looping() -> None:
    payload, pos = body(11, kio_request(11, [], []))
    topics_at = pos + 4 * 4 + 1 + 8  # replica, max wait, min, max, isolation, session id, epoch
    payload[topics_at : topics_at + 4] = (2**31 - 1).to_bytes(4, "big")
    with pytest.raises(WireFormatError, match="array of 2147483647 elements"):
        parse_fetch_request(payload, pos, 11)
