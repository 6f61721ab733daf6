"""parse_fetch_response: the replica fetcher's in-place reader, checked against the broker's own
Fetch response writer (exactly.protocol.fast) for the classic and the flexible layout."""

from __future__ import annotations

import struct

import pytest

from exactly.protocol.fast import FetchPartitionResult, encode_fetch_response
from exactly.protocol.fetch_response import FetchedPartition, parse_fetch_response
from exactly.protocol.primitives import WireFormatError

RECORDS_A = b"A" * 300
RECORDS_B = b"B" * 70


def frame(
    version: int, topics: list[tuple[str, list[FetchPartitionResult]]], correlation: int = 42
) -> bytearray:
    """A whole response frame without its size prefix: header + the broker's encoded body."""
    header = struct.pack(">i", correlation) + (b"\x00" if version >= 12 else b"")
    return bytearray(header + b"".join(bytes(c) for c in encode_fetch_response(version, 0, 0, topics)))


TOPICS = [
    (
        "orders",
        [
            FetchPartitionResult(0, 0, 10, 9, 2, None, RECORDS_A),
            FetchPartitionResult(1, 6, -1, -1, -1, None, b""),
        ],
    ),
    ("t", [FetchPartitionResult(3, 0, 5, 5, 0, [(7, 1), (8, 4)], RECORDS_B)]),
]


@pytest.mark.parametrize("version", [7, 11, 12, 13])
def test_fields_and_record_regions(version: int) -> None:
    buf = frame(version, TOPICS)
    view = parse_fetch_response(buf, version)
    assert (view.correlation_id, view.error_code, view.session_id) == (42, 0, 0)
    parts = view.partitions
    assert [(p.topic, p.partition, p.error_code) for p in parts] == [
        ("orders", 0, 0),
        ("orders", 1, 6),
        ("t", 3, 0),
    ]
    assert [(p.high_watermark, p.last_stable_offset, p.log_start_offset) for p in parts] == [
        (10, 9, 2),
        (-1, -1, -1),
        (5, 5, 0),
    ]
    assert buf[parts[0].records_start : parts[0].records_end] == RECORDS_A
    assert parts[1].records_start == parts[1].records_end
    assert buf[parts[2].records_start : parts[2].records_end] == RECORDS_B
    assert all(p.diverging_epoch is None for p in parts)


def test_diverging_epoch_tag_is_read_in_v12() -> None:
    buf = frame(12, [("t", [FetchPartitionResult(0, 0, 5, 5, 0, None, RECORDS_B)])])
    # the writer ends the partition with an empty tag section (b"\x00"); put tag 0 there instead
    tags_at = len(buf) - 3  # partition tags, topic tags, top-level tags
    assert buf[tags_at:] == b"\x00\x00\x00"
    epoch_end = struct.pack(">iq", 4, 123) + b"\x00"
    buf[tags_at : tags_at + 1] = b"\x01\x00" + bytes([len(epoch_end)]) + epoch_end
    (part,) = parse_fetch_response(buf, 12).partitions
    assert part.diverging_epoch == (4, 123)
    assert buf[part.records_start : part.records_end] == RECORDS_B


@pytest.mark.parametrize("version", [11, 12])
def test_truncated_frames_raise(version: int) -> None:
    buf = frame(version, TOPICS)
    for cut in (3, 20, len(buf) - len(RECORDS_B) - 10, len(buf) - 1):
        with pytest.raises(WireFormatError):
            parse_fetch_response(buf[:cut], version)


def test_records_longer_than_the_frame_raise() -> None:
    buf = frame(11, [("t", [FetchPartitionResult(0, 0, 5, 5, 0, None, RECORDS_B)])])
    size_at = len(buf) - len(RECORDS_B) - 4
    buf[size_at : size_at + 4] = struct.pack(">i", len(RECORDS_B) + 1)
    with pytest.raises(WireFormatError, match="run past the frame"):
        parse_fetch_response(buf, 11)


def test_old_versions_are_refused() -> None:
    with pytest.raises(ValueError, match="v7"):
        parse_fetch_response(bytearray(100), 6)


def test_partition_is_plain_data() -> None:
    part = FetchedPartition("t", 0, 0, 1, 1, 0, 10, 20)
    assert part.diverging_epoch is None
