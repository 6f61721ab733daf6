"""Fetch request reader, v4-v12, by hand: what consumers and followers send most often.

Why: every acks=all produce wakes a parked consumer Fetch (and, in a cluster, a follower Fetch
per replica), and each of those requests was parsed by kio after the overlong-array guard walked
it once more: about 40% of a small Fetch's CPU in ``bench/dispatch_micro.py`` once the read
itself was cheap. Here a few ``struct`` reads build slotted dataclasses whose attribute names are
kio's (``FetchRequest.topics[i].partitions[j].fetch_offset`` ...), so the handler reads either.

Layout (Kafka's FetchRequest.json): replica_id, max_wait_ms, min_bytes, max_bytes,
isolation_level (v4+), session_id and session_epoch (v7+), topics [topic, partitions [partition,
current_leader_epoch (v9+), fetch_offset, last_fetched_epoch (v12+), log_start_offset (v5+),
partition_max_bytes]], forgotten_topics_data [topic, partitions [int32]] (v7+), rack_id (v11+).
v12 is flexible: compact lengths and a tagged-field section after every struct (cluster_id is
tag 0 of the top-level section; skipped, as every unknown tag). Equivalence with kio's reader is
checked by tests/protocol/test_fetch_request_reader.py. Every short or malformed input raises
WireFormatError (the dispatcher closes the connection, as for any unparseable request).
"""

from __future__ import annotations

import datetime
import struct
from dataclasses import dataclass

from exactly.protocol.primitives import WireFormatError, read_uvarint, skip_tagged_fields

_TOP = struct.Struct(">iiiib")  # replica id, max wait ms, min bytes, max bytes, isolation level
_SESSION = struct.Struct(">ii")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class FetchPartitionRequest:
    partition: int
    current_leader_epoch: int
    fetch_offset: int
    last_fetched_epoch: int
    log_start_offset: int
    partition_max_bytes: int


@dataclass(frozen=True, slots=True)
class FetchTopicRequest:
    topic: str
    partitions: tuple[FetchPartitionRequest, ...]


@dataclass(frozen=True, slots=True)
class ForgottenTopic:
    topic: str
    partitions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class FetchRequestData:
    replica_id: int
    max_wait: datetime.timedelta
    min_bytes: int
    max_bytes: int
    isolation_level: int
    session_id: int
    session_epoch: int
    topics: tuple[FetchTopicRequest, ...]
    forgotten_topics_data: tuple[ForgottenTopic, ...]
    rack_id: str


def _partition_layout(version: int) -> struct.Struct:
    if version >= 12:  # partition, current epoch, fetch offset, last fetched epoch, log start, max
        return struct.Struct(">iiqiqi")
    if version >= 9:
        return struct.Struct(">iiqqi")
    if version >= 5:
        return struct.Struct(">iqqi")
    return struct.Struct(">iqi")


_PARTITION = {v: _partition_layout(v) for v in range(4, 13)}


def parse_fetch_request(buf: bytes | bytearray, pos: int, version: int) -> FetchRequestData:
    if not 4 <= version <= 12:
        raise WireFormatError(f"Fetch v{version} is not read here (v4-v12)")
    try:
        return _parse(memoryview(buf), pos, version)
    except struct.error as exc:  # unpack_from past the end
        raise WireFormatError(f"Fetch request is truncated: {exc}") from None


def _parse(view: memoryview, pos: int, version: int) -> FetchRequestData:
    flexible = version >= 12
    end = len(view)

    def length() -> int:
        """An array or string length (compact: uvarint of n + 1); -1 is null."""
        nonlocal pos
        if flexible:
            n, pos = read_uvarint(view, pos)
            return n - 1
        n = _I32.unpack_from(view, pos)[0]
        pos += 4
        return int(n)

    def count() -> int:
        n = length()
        if n > end - pos:  # every element takes at least one byte
            raise WireFormatError(f"array of {n} elements in {end - pos} bytes")
        return max(n, 0)

    def string() -> str:
        nonlocal pos
        if flexible:
            n = length()
        else:
            n = _I16.unpack_from(view, pos)[0]
            pos += 2
        if n < 0 or pos + n > end:
            raise WireFormatError("null or truncated string in a Fetch request")
        pos += n
        return str(view[pos - n : pos], "utf-8")

    replica_id, max_wait_ms, min_bytes, max_bytes, isolation_level = _TOP.unpack_from(view, pos)
    pos += _TOP.size
    session_id, session_epoch = 0, -1
    if version >= 7:
        session_id, session_epoch = _SESSION.unpack_from(view, pos)
        pos += _SESSION.size
    layout = _PARTITION[version]
    topics = []
    for _ in range(count()):
        name = string()
        partitions = []
        for _ in range(count()):
            fields = layout.unpack_from(view, pos)
            pos += layout.size
            if flexible:
                pos = skip_tagged_fields(view, pos)
                partitions.append(FetchPartitionRequest(*fields))
            elif version >= 9:
                index, epoch, offset, start, limit = fields
                partitions.append(FetchPartitionRequest(index, epoch, offset, -1, start, limit))
            elif version >= 5:
                index, offset, start, limit = fields
                partitions.append(FetchPartitionRequest(index, -1, offset, -1, start, limit))
            else:
                index, offset, limit = fields
                partitions.append(FetchPartitionRequest(index, -1, offset, -1, -1, limit))
        if flexible:
            pos = skip_tagged_fields(view, pos)
        topics.append(FetchTopicRequest(name, tuple(partitions)))
    forgotten = []
    if version >= 7:
        for _ in range(count()):
            name = string()
            indexes = []
            for _ in range(count()):
                indexes.append(_I32.unpack_from(view, pos)[0])
                pos += 4
            if flexible:
                pos = skip_tagged_fields(view, pos)
            forgotten.append(ForgottenTopic(name, tuple(indexes)))
    rack_id = string() if version >= 11 else ""
    if flexible:
        pos = skip_tagged_fields(view, pos)
    return FetchRequestData(
        replica_id,
        datetime.timedelta(milliseconds=max_wait_ms),
        min_bytes,
        max_bytes,
        isolation_level,
        session_id,
        session_epoch,
        tuple(topics),
        tuple(forgotten),
        rack_id,
    )
