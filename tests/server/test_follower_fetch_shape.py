"""The leader's parse of a follower Fetch by comparison (``follower_fetch_shape``) against the full
parse (``follower_fetch_fast._parse``): equal whenever it answers, None for any other frame."""

from __future__ import annotations

import pytest

from exactly.protocol.fetch_request import FetchPosition, ReplicaFetchTemplate
from exactly.server.follower_fetch_fast import _parse
from exactly.server.follower_fetch_shape import MAX_SHAPES, FetchShapes
from exactly.types import TopicPartition


def _template(version: int, replica_id: int = 1, topics: int = 1, parts: int = 1) -> ReplicaFetchTemplate:
    return ReplicaFetchTemplate.build(
        version, f"replica-{replica_id}", replica_id=replica_id, max_wait_ms=500, min_bytes=1,
        max_bytes=10 * 1024 * 1024,
        topics=[
            (f"topic-{t}", [FetchPosition(p, 3, 0, 0, 1024 * 1024, last_fetched_epoch=3) for p in range(parts)])
            for t in range(topics)
        ],
    )  # fmt: skip


def _remembered(shapes: FetchShapes, frame: bytearray) -> None:
    payload = frame[4:]
    positions: list[int] = []
    parsed = _parse(payload, positions)
    assert parsed is not None
    shapes.remember(payload, parsed, positions)


def _moving(version: int, positions: list[int]) -> set[int]:
    """The bytes a shape does not compare: the correlation id, each partition's fields after its index."""
    width = 32 if version >= 12 else 28
    out = set(range(4, 8))
    for pos in positions:
        out.update(range(pos + 4, pos + width))
    return out


@pytest.mark.parametrize("version", [11, 12])
@pytest.mark.parametrize(("topics", "parts"), [(1, 1), (2, 3)])
def test_the_next_fetch_of_a_replica_parses_as_the_full_parse_does(
    version: int, topics: int, parts: int
) -> None:
    template = _template(version, topics=topics, parts=parts)
    n = topics * parts
    shapes = FetchShapes()
    first = template.fill(7, [(100, 3, 0)] * n)
    assert shapes.parse(first[4:]) is None  # nothing remembered yet
    _remembered(shapes, first)
    for correlation, moving in ((8, [(101, 3, 0)] * n), (9, [(5000 + i, 4, 17) for i in range(n)])):
        payload = template.fill(correlation, moving)[4:]
        got = shapes.parse(payload)
        assert got is not None
        assert got == _parse(payload)
        assert got[1] == correlation


@pytest.mark.parametrize("version", [11, 12])
def test_a_frame_differing_in_any_compared_byte_is_left_to_the_full_parse(version: int) -> None:
    """Every byte of the frame flipped in turn: outside the moving fields the shape declines
    (the full parse decides, whatever the frame now says); inside them it parses as the full
    parse does."""
    template = _template(version, topics=2, parts=2)
    shapes = FetchShapes()
    frame = template.fill(7, [(100, 3, 0)] * 4)
    _remembered(shapes, frame)
    positions: list[int] = []
    _parse(frame[4:], positions)
    moving = _moving(version, positions)
    base = frame[4:]
    for i in range(len(base)):
        payload = bytearray(base)
        payload[i] ^= 0xFF
        got = shapes.parse(payload)
        if i in moving:
            assert got is not None and got == _parse(payload), i
        else:
            assert got is None, i
    assert shapes.parse(base + b"\x00") is None  # another length
    assert shapes.parse(base[:-1]) is None


def test_one_shape_per_replica_and_at_most_max_shapes() -> None:
    shapes = FetchShapes()
    one, two = _template(12, replica_id=1), _template(12, replica_id=2)
    _remembered(shapes, one.fill(1, [(10, 3, 0)]))
    _remembered(shapes, two.fill(1, [(10, 3, 0)]))
    for template, replica in ((one, 1), (two, 2)):
        got = shapes.parse(template.fill(2, [(11, 3, 0)])[4:])
        assert got is not None and got[2] == replica
    # replica 1 now fetches another partition set: its old shape is replaced, not kept beside it
    other = _template(12, replica_id=1, parts=2)
    _remembered(shapes, other.fill(3, [(10, 3, 0)] * 2))
    assert shapes.parse(one.fill(4, [(12, 3, 0)])[4:]) is None
    assert shapes.parse(other.fill(4, [(12, 3, 0)] * 2)[4:]) is not None
    for r in range(100, 100 + 2 * MAX_SHAPES):
        _remembered(shapes, _template(12, replica_id=r).fill(1, [(1, 3, 0)]))
    assert len(shapes._shapes) == MAX_SHAPES
    newest = _template(12, replica_id=100 + 2 * MAX_SHAPES - 1)
    assert shapes.parse(newest.fill(2, [(2, 3, 0)])[4:]) is not None


def test_a_shape_hands_out_the_given_equal_partition_objects() -> None:
    """``remember(..., tps)``: the next parses carry those objects (the logs' own keys), equal to
    the parsed ones; objects of other partitions are refused."""
    template = _template(12, topics=2, parts=2)
    payload = template.fill(1, [(10, 3, 0)] * 4)[4:]
    positions: list[int] = []
    parsed = _parse(payload, positions)
    assert parsed is not None
    own = [TopicPartition(name, p[0]) for name, parts in parsed[6] for p in parts]
    shapes = FetchShapes()
    with pytest.raises(ValueError):
        shapes.remember(payload, parsed, positions, list(reversed(own)))
    shapes.remember(payload, parsed, positions, own)
    again = template.fill(2, [(11, 3, 0)] * 4)[4:]
    got = shapes.parse(again)
    assert got is not None and got == _parse(again)
    assert [p[6] for _name, parts in got[6] for p in parts] == own
    assert all(a is b for a, b in zip((p[6] for _n, parts in got[6] for p in parts), own, strict=True))
