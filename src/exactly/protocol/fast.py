"""Hand-written codecs for the two hot APIs: Produce requests/responses and Fetch responses.

Why: the generic schema writer walks dataclasses field by field in Python, and the generic
reader copies every partition's records into a new ``bytes``. On the hot path the records must
stay where the socket put them: ``parse_produce_request`` returns memoryviews into the request
frame (a bytearray owned by the request), so the broker patches offsets in place and writes
them to the segment with no copy in between; ``encode_fetch_response`` returns a list of chunks
for ``transport.writelines`` so record bytes read from segments are never joined into one
response buffer.

Layouts (Kafka's message specs): Produce v3-v8 and Fetch v4-v11 use classic encodings (int16
string lengths, int32 array/bytes lengths); Produce v9+ and Fetch v12+ are "flexible": compact
lengths as unsigned varints of length+1 and a tagged-field section after every struct. Unknown
tagged fields are skipped, as Kafka does. Equivalence with kio's generic codec is checked by
tests/protocol/test_fast.py for every version we advertise.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence, Sized
from dataclasses import dataclass

from exactly.frozen import quick_init
from exactly.protocol.primitives import (
    WireFormatError,
    read_uvarint,
    skip_tagged_fields,
    write_uvarint,
)

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_ACKS_TIMEOUT = struct.Struct(">hi")
_PRODUCE_PART_V3 = struct.Struct(">ihqq")  # index, error, base offset, log append time
_PRODUCE_PART_V5 = struct.Struct(">ihqqq")  # + log start offset
_FETCH_PART_V4 = struct.Struct(">ihqq")  # index, error, high watermark, last stable offset
_FETCH_PART_V5 = struct.Struct(">ihqqq")  # + log start offset
_ABORTED = struct.Struct(">qq")
_DIVERGING = struct.Struct(">iq")  # EpochEndOffset: epoch, end offset


class WireError(WireFormatError):
    """The request bytes do not follow the schema."""


@quick_init
@dataclass(frozen=True, slots=True)
class ProducePartition:
    index: int
    records: memoryview | None


@quick_init
@dataclass(frozen=True, slots=True)
class ProduceTopic:
    name: str
    partitions: tuple[ProducePartition, ...]


@quick_init
@dataclass(frozen=True, slots=True)
class ProduceRequestData:
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topics: tuple[ProduceTopic, ...]


def _length(view: memoryview, pos: int, flexible: bool, classic: struct.Struct) -> tuple[int, int]:
    """(length, position after it): compact (uvarint of n + 1) or classic; -1 is null."""
    if flexible:
        n, pos = read_uvarint(view, pos)
        return n - 1, pos
    if pos + classic.size > len(view):
        raise WireError("produce request is truncated")
    return classic.unpack_from(view, pos)[0], pos + classic.size


def _string(view: memoryview, pos: int, flexible: bool, nullable: bool) -> tuple[str | None, int]:
    length, pos = _length(view, pos, flexible, _I16)
    if length < 0:
        if not nullable:
            raise WireError("null string where a string is required")
        return None, pos
    end = pos + length
    if end > len(view):
        raise WireError("produce request is truncated")
    return str(view[pos:end], "utf-8"), end


def parse_produce_request(buf: bytes | bytearray, pos: int, version: int) -> ProduceRequestData:
    """Module-level helpers, not closures: this runs once per Produce, and creating three
    closures per call was a visible part of a one-record request's parse. Flexible versions
    (what current clients send) go through ``_parse_flexible``."""
    if version >= 9:
        try:
            return _parse_flexible(buf, pos)
        except IndexError:  # a length or tag byte past the end of the frame
            raise WireError("produce request is truncated") from None
    view = memoryview(buf)
    end = len(buf)
    transactional_id, pos = _string(view, pos, False, True)
    if pos + 6 > end:
        raise WireError("produce request is truncated")
    acks, timeout_ms = _ACKS_TIMEOUT.unpack_from(buf, pos)
    pos += 6
    topics: list[ProduceTopic] = []
    n_topics, pos = _length(view, pos, False, _I32)
    for _ in range(max(n_topics, 0)):
        name, pos = _string(view, pos, False, False)
        assert name is not None
        partitions: list[ProducePartition] = []
        n_parts, pos = _length(view, pos, False, _I32)
        for _ in range(max(n_parts, 0)):
            if pos + 4 > end:
                raise WireError("produce request is truncated")
            index = _I32.unpack_from(buf, pos)[0]
            size, pos = _length(view, pos + 4, False, _I32)
            records: memoryview | None = None
            if size >= 0:
                if pos + size > end:
                    raise WireError("produce request is truncated")
                records = view[pos : pos + size]
                pos += size
            partitions.append(ProducePartition(index, records))
        topics.append(ProduceTopic(name, tuple(partitions)))
    return ProduceRequestData(transactional_id, acks, timeout_ms, tuple(topics))


def _parse_flexible(buf: bytes | bytearray, pos: int) -> ProduceRequestData:
    """Produce v9+: compact lengths (uvarint of n + 1) and a tag section after each struct.
    Lengths and tag counts below 128 (all of them, in practice) are one byte and are read
    inline, the rest through ``read_uvarint``; an empty tag section is one zero byte. A
    one-record Produce has nine of these, and the calls were a fifth of its parse. Indexing
    past the end raises IndexError, which the caller turns into WireError."""
    view = memoryview(buf)
    end = len(buf)
    n = buf[pos]
    if n < 0x80:
        pos += 1
    else:
        n, pos = read_uvarint(buf, pos)
    transactional_id: str | None = None
    if n:
        if pos + n - 1 > end:
            raise WireError("produce request is truncated")
        transactional_id = str(view[pos : pos + n - 1], "utf-8")
        pos += n - 1
    if pos + 6 > end:
        raise WireError("produce request is truncated")
    acks, timeout_ms = _ACKS_TIMEOUT.unpack_from(buf, pos)
    pos += 6
    topics: list[ProduceTopic] = []
    n_topics = buf[pos]
    if n_topics < 0x80:
        pos += 1
    else:
        n_topics, pos = read_uvarint(buf, pos)
    for _ in range(n_topics - 1):
        n = buf[pos]
        if n < 0x80:
            pos += 1
        else:
            n, pos = read_uvarint(buf, pos)
        if n == 0:
            raise WireError("null string where a string is required")
        if pos + n - 1 > end:
            raise WireError("produce request is truncated")
        name = str(view[pos : pos + n - 1], "utf-8")
        pos += n - 1
        partitions: list[ProducePartition] = []
        n_parts = buf[pos]
        if n_parts < 0x80:
            pos += 1
        else:
            n_parts, pos = read_uvarint(buf, pos)
        for _ in range(n_parts - 1):
            if pos + 4 > end:
                raise WireError("produce request is truncated")
            index = _I32.unpack_from(buf, pos)[0]
            pos += 4
            n = buf[pos]
            if n < 0x80:
                pos += 1
            else:
                n, pos = read_uvarint(buf, pos)
            records: memoryview | None = None
            if n:
                if pos + n - 1 > end:
                    raise WireError("produce request is truncated")
                records = view[pos : pos + n - 1]
                pos += n - 1
            if buf[pos] == 0:
                pos += 1
            else:
                pos = skip_tagged_fields(view, pos)
            partitions.append(ProducePartition(index, records))
        if buf[pos] == 0:
            pos += 1
        else:
            pos = skip_tagged_fields(view, pos)
        topics.append(ProduceTopic(name, tuple(partitions)))
    return ProduceRequestData(transactional_id, acks, timeout_ms, tuple(topics))


# ---- writers ---------------------------------------------------------------------------------


class _Writer:
    __slots__ = ("flexible", "out")

    def __init__(self, flexible: bool) -> None:
        self.flexible = flexible
        self.out = bytearray()

    def count(self, n: int) -> None:
        if self.flexible:
            self.out += write_uvarint(n + 1)
        else:
            self.out += _I32.pack(n)

    def string(self, value: str | None) -> None:
        if value is None:
            self.out += b"\x00" if self.flexible else b"\xff\xff"
            return
        raw = value.encode("utf-8")
        if self.flexible:
            self.out += write_uvarint(len(raw) + 1)
        else:
            self.out += _I16.pack(len(raw))
        self.out += raw

    def tags(self) -> None:
        if self.flexible:
            self.out.append(0)


@quick_init
@dataclass(frozen=True, slots=True)
class ProducePartitionResult:
    index: int
    error_code: int
    base_offset: int
    log_append_time: int
    log_start_offset: int
    error_message: str | None = None


def encode_produce_response(
    version: int, topics: Sequence[tuple[str, Sequence[ProducePartitionResult]]]
) -> bytes:
    if version >= 8 and len(topics) == 1 and len(topics[0][1]) == 1 and topics[0][1][0].error_message is None:
        return _one_partition_response(version, topics[0][0], topics[0][1][0])
    w = _Writer(version >= 9)
    w.count(len(topics))
    for name, parts in topics:
        w.string(name)
        w.count(len(parts))
        for p in parts:
            if version >= 5:
                w.out += _PRODUCE_PART_V5.pack(
                    p.index, p.error_code, p.base_offset, p.log_append_time, p.log_start_offset
                )
            else:
                w.out += _PRODUCE_PART_V3.pack(p.index, p.error_code, p.base_offset, p.log_append_time)
            if version >= 8:
                w.count(0)  # record_errors
                w.string(p.error_message)
            w.tags()
        w.tags()
    w.out += _I32.pack(0)  # throttle_time_ms
    w.tags()
    return bytes(w.out)


def _one_partition_response(version: int, name: str, p: ProducePartitionResult) -> bytes:
    """``encode_produce_response`` of the usual answer (one partition, no error message) in a
    few packs: a linger.ms=0 producer sends one Produce per record, and the general writer's
    calls were a tenth of such a request's dispatch. Same bytes (tests/protocol/test_fast.py)."""
    raw = name.encode("utf-8")
    part = _PRODUCE_PART_V5.pack(p.index, p.error_code, p.base_offset, p.log_append_time, p.log_start_offset)
    if version >= 9:  # counts +1 as uvarints, no record errors, null message, tags everywhere
        return b"".join((b"\x02", write_uvarint(len(raw) + 1), raw, b"\x02", part, _ONE_V9_TAIL))
    return b"".join((_ONE_COUNT, _I16.pack(len(raw)), raw, _ONE_COUNT, part, _ONE_V8_TAIL))


_ONE_COUNT = _I32.pack(1)
# record_errors empty, error_message null, [v9: partition tags, topic tags], throttle 0, [tags]
_ONE_V8_TAIL = _I32.pack(0) + _I16.pack(-1) + _I32.pack(0)
_ONE_V9_TAIL = b"\x01\x00\x00\x00" + _I32.pack(0) + b"\x00"


@quick_init
@dataclass(frozen=True, slots=True)
class FetchPartitionResult:
    index: int
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    aborted: Sequence[tuple[int, int]] | None  # (producer id, first offset); None = null array
    # never null: Kafka writes MemoryRecords.EMPTY on error partitions. Any sized chunk the
    # writer of the response knows (the connection sends a storage FileSlice with sendfile).
    records: bytes | memoryview | Sized
    # v12+ tagged field 0 (KIP-595 truncation-on-fetch): (epoch, end offset) where the follower's
    # last fetched epoch ends at the leader, when its log diverged; None = absent.
    diverging_epoch: tuple[int, int] | None = None


def encode_fetch_response(
    version: int,
    error_code: int,
    session_id: int,
    topics: Sequence[tuple[str, Sequence[FetchPartitionResult]]],
) -> list[bytes | memoryview | Sized]:
    """Chunks of the response body; record bytes are passed through as their own chunks.

    Records are never written as null: Kafka's brokers put an empty record set on partitions that
    carry an error, and librdkafka rejects a null one ("invalid MessageSetSize -1") without
    reading the partition's error code. ``aborted`` stays nullable: Kafka writes null for
    read_uncommitted and for error partitions, an array (maybe empty) for read_committed.
    """
    flexible = version >= 12
    w = _Writer(flexible)
    chunks: list[bytes | memoryview | Sized] = []
    w.out += _I32.pack(0)  # throttle_time_ms
    if version >= 7:
        w.out += _I16.pack(error_code)
        w.out += _I32.pack(session_id)
    w.count(len(topics))
    for name, parts in topics:
        w.string(name)
        w.count(len(parts))
        for p in parts:
            if version >= 5:
                w.out += _FETCH_PART_V5.pack(
                    p.index, p.error_code, p.high_watermark, p.last_stable_offset, p.log_start_offset
                )
            else:
                w.out += _FETCH_PART_V4.pack(p.index, p.error_code, p.high_watermark, p.last_stable_offset)
            if p.aborted is None:
                w.out += b"\x00" if flexible else b"\xff\xff\xff\xff"
            else:
                w.count(len(p.aborted))
                for producer_id, first_offset in p.aborted:
                    w.out += _ABORTED.pack(producer_id, first_offset)
                    w.tags()
            if version >= 11:
                w.out += _I32.pack(-1)  # preferred_read_replica
            records = p.records
            size = len(records)
            w.out += write_uvarint(size + 1) if flexible else _I32.pack(size)
            if size:
                chunks.append(bytes(w.out))
                chunks.append(records)
                w.out = bytearray()
            if flexible and p.diverging_epoch is not None:
                epoch, end_offset = p.diverging_epoch
                # one tagged field: tag 0, size, then EpochEndOffset {epoch, end offset, no tags}
                w.out += b"\x01\x00" + write_uvarint(_DIVERGING.size + 1)
                w.out += _DIVERGING.pack(epoch, end_offset) + b"\x00"
            else:
                w.tags()
        w.tags()
    w.tags()
    chunks.append(bytes(w.out))
    return chunks


__all__ = [
    "FetchPartitionResult",
    "ProducePartition",
    "ProducePartitionResult",
    "ProduceRequestData",
    "ProduceTopic",
    "WireError",
    "encode_fetch_response",
    "encode_produce_response",
    "parse_produce_request",
    "skip_tagged_fields",
]
