"""Produce v9+ parsing (``_parse_flexible``): the inline one-byte varint and empty-tag paths, and
the general ones next to them (multi-byte lengths, non-empty tag sections, truncation)."""

from __future__ import annotations

import datetime
import io

import pytest
from kio.serial import entity_writer

from exactly.protocol.apis import VERSION_RANGES, ApiKey, build, schema
from exactly.protocol.fast import parse_produce_request
from exactly.protocol.primitives import WireFormatError

FLEXIBLE = range(9, VERSION_RANGES[ApiKey.PRODUCE][1] + 1)


def _encode(version: int, txn: str | None, topics: list[tuple[str, list[tuple[int, bytes | None]]]]) -> bytes:
    api = schema(ApiKey.PRODUCE, version)
    mod = api.request_module
    req = build(
        api.request_type,
        transactional_id=txn,
        acks=-1,
        timeout=datetime.timedelta(milliseconds=1500),
        topic_data=tuple(
            build(
                mod.TopicProduceData,
                name=name,
                partition_data=tuple(build(mod.PartitionProduceData, index=i, records=r) for i, r in parts),
            )
            for name, parts in topics
        ),
    )
    out = io.BytesIO()
    entity_writer(api.request_type)(out, req)
    return out.getvalue()


def _shape(parsed: object) -> list[tuple[str, list[tuple[int, bytes | None]]]]:
    return [
        (t.name, [(p.index, None if p.records is None else bytes(p.records)) for p in t.partitions])
        for t in parsed.topics  # type: ignore[attr-defined]
    ]


@pytest.mark.parametrize("version", FLEXIBLE)
def test_lengths_of_two_and_three_varint_bytes(version: int) -> None:
    txn = "t" * 200
    topics = [("n" * 150, [(1, b"r" * 300), (2, None), (3, b"x" * 20_000)]), ("short", [(0, b"")])]
    raw = _encode(version, txn, topics)
    parsed = parse_produce_request(bytearray(b"HD" + raw), 2, version)
    assert parsed.transactional_id == txn and parsed.acks == -1 and parsed.timeout_ms == 1500
    assert _shape(parsed) == topics


@pytest.mark.parametrize("version", FLEXIBLE)
def test_unknown_tagged_fields_are_skipped(version: int) -> None:
    records = b"RECORDS!"
    raw = _encode(version, None, [("tp", [(4, records)])])
    at = raw.index(records) + len(records)  # the partition's tag section, then the topic's
    assert raw[at : at + 2] == b"\x00\x00"
    tags = b"\x02" + b"\x05\x02ab" + b"\x07\x00"  # two unknown tags: (5, b"ab"), (7, b"")
    spliced = raw[:at] + tags + tags + raw[at + 2 :]
    parsed = parse_produce_request(bytearray(spliced), 0, version)
    assert _shape(parsed) == [("tp", [(4, records)])]


@pytest.mark.parametrize("version", FLEXIBLE)
def test_every_truncation_is_refused(version: int) -> None:
    raw = _encode(version, "txn", [("topic", [(0, b"r" * 200)]), ("other", [(1, b"s")])])
    # the last byte is the request's own (empty) tag section, which the parser does not read
    for cut in range(len(raw) - 1):
        with pytest.raises(WireFormatError):
            parse_produce_request(bytearray(raw[:cut]), 0, version)
