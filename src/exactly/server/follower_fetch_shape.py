"""The leader's parse of a follower Fetch by comparison with the same replica's previous one.

Why: a replica fetcher sends the same Fetch again and again (``protocol.fetch_request``'s
``ReplicaFetchTemplate``): the same client id, replica id, wait, sizes, topics and partitions;
only the correlation id and, per partition, the offsets (current leader epoch, fetch offset,
last fetched epoch, log start, partition max bytes) move. ``follower_fetch_fast._parse`` walks
the whole frame on every arrival (two per acks=all message at RF 3: a dozen Python calls and a
``TopicPartition`` built per partition each time). Here the frame is compared, outside those
fields, with the last one ``_parse`` read, and only the moving fields are unpacked; the parsed
topics reuse that parse's names and ``TopicPartition`` objects.

Invariant: ``FetchShapes.parse(payload)`` is ``_parse(payload)`` whenever it is not None.
``_parse``'s decisions (the API, version, header tags, replica id >= 0, isolation, session,
counts, name lengths, tag bytes, forgotten topics, rack, the frame's end) read only bytes outside
the moving fields, and the moving fields are fixed-width integers it takes as they are; a frame
of the same length equal to a remembered one outside them is therefore parsed to the same
structure with the new values. Anything else (another length, any other byte different) is
None, and the caller parses it fully. No state of the broker is read or changed: a shape is a
parse cache and nothing else. Equivalence: tests/server/test_follower_fetch_shape.py.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from exactly.types import TopicPartition

# (partition, current epoch, fetch offset, last fetched epoch, log start, partition max bytes);
# v11 has no last fetched epoch (NO_EPOCH, as ``_parse`` gives)
_PART_V12 = struct.Struct(">iiqiqi")
_PART_V11 = struct.Struct(">iiqqi")
_I32 = struct.Struct(">i")
_NO_EPOCH = -1
# at most this many shapes (one per replica id; a cluster has few brokers)
MAX_SHAPES = 16

# (partition, current leader epoch, fetch offset, last fetched epoch, log start, partition max bytes, tp)
_Part = tuple[int, int, int, int, int, int, TopicPartition]
Parsed = tuple[int, int, int, int, int, int, list[tuple[str, list[_Part]]]]


@dataclass(frozen=True, slots=True)
class _Shape:
    """One remembered Fetch: its length, the bytes outside the moving fields as (start, bytes)
    runs, and per topic its name and per partition (position of its entry, its tp)."""

    size: int
    version: int
    replica_id: int
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    fixed: tuple[tuple[int, int, bytes], ...]  # (start, end, the bytes there)
    topics: tuple[tuple[str, tuple[tuple[int, TopicPartition], ...]], ...]

    def fill(self, payload: bytearray) -> Parsed:
        unpack = (_PART_V12 if self.version >= 12 else _PART_V11).unpack_from
        v12 = self.version >= 12
        topics: list[tuple[str, list[_Part]]] = []
        for name, entries in self.topics:
            parts: list[_Part] = []
            for pos, tp in entries:
                if v12:
                    index, epoch, offset, last_epoch, log_start, pmax = unpack(payload, pos)
                else:
                    index, epoch, offset, log_start, pmax = unpack(payload, pos)
                    last_epoch = _NO_EPOCH
                parts.append((index, epoch, offset, last_epoch, log_start, pmax, tp))
            topics.append((name, parts))
        correlation_id = _I32.unpack_from(payload, 4)[0]
        return (
            self.version, correlation_id, self.replica_id, self.max_wait_ms, self.min_bytes,
            self.max_bytes, topics,
        )  # fmt: skip


class FetchShapes:
    """The last parsed Fetch of each replica id (see the module docstring)."""

    __slots__ = ("_shapes",)

    def __init__(self) -> None:
        self._shapes: list[_Shape] = []

    def parse(self, payload: bytearray) -> Parsed | None:
        """``_parse(payload)`` when the frame matches a remembered shape, else None."""
        size = len(payload)
        for shape in self._shapes:
            if shape.size != size:
                continue
            for start, end, expected in shape.fixed:
                if payload[start:end] != expected:
                    break
            else:
                return shape.fill(payload)
        return None

    def remember(
        self,
        payload: bytearray,
        parsed: Parsed,
        positions: list[int],
        tps: list[TopicPartition] | None = None,
    ) -> None:
        """Keep ``payload``'s shape: ``parsed`` is ``_parse(payload)`` and ``positions`` the
        start of each partition's entry in the frame, in the parse's order; ``tps`` (given):
        the objects the next parses hand out instead of the parsed ones, each equal to its
        partition's (ValueError otherwise)."""
        version, _correlation, replica_id, max_wait_ms, min_bytes, max_bytes, topics = parsed
        width = _PART_V12.size if version >= 12 else _PART_V11.size
        fixed: list[tuple[int, int, bytes]] = []
        at = 0
        moving = [(4, 8)] + [(pos + 4, pos + width) for pos in positions]  # after each partition index
        for start, end in moving:
            fixed.append((at, start, bytes(payload[at:start])))
            at = end
        fixed.append((at, len(payload), bytes(payload[at:])))
        flat = [p[6] for _name, parts in topics for p in parts]
        if tps is not None:
            if tps != flat:
                raise ValueError("not the parsed partitions")
            flat = tps
        it = iter(zip(positions, flat, strict=True))
        shape_topics = tuple((name, tuple(next(it) for _p in parts)) for name, parts in topics)
        shape = _Shape(
            len(payload), version, replica_id, max_wait_ms, min_bytes, max_bytes, tuple(fixed), shape_topics
        )
        kept = [s for s in self._shapes if s.replica_id != replica_id]
        self._shapes = [shape, *kept[: MAX_SHAPES - 1]]


__all__ = ["MAX_SHAPES", "FetchShapes"]
