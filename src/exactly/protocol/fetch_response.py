"""Fetch response reader for the replica fetcher: record bytes stay in the response frame.

Why: kio's generic reader copies every partition's records into a new ``bytes`` (and the
fetcher then copied them again into a bytearray and once more per batch). A follower appends
those bytes to its segment unchanged, so ``parse_fetch_response`` returns only *where* each
partition's records lie in the frame (``records_start``/``records_end``, absolute positions),
and the fetcher hands the frame itself plus batch headers to the log. Nothing here copies
record bytes.

Versions: Fetch v7-v11 (classic: int16 string lengths, int32 array/bytes lengths) and v12+
(flexible: compact lengths as unsigned varints of length+1 and a tagged-field section after
every struct). In v12+ a partition's ``diverging_epoch`` (tag 0, KIP-320) is read; other tags
are skipped, as Kafka skips the ones it does not know. The frame starts with the response
header (correlation id; v12+ also a tagged-field section).

Invariant: every position returned lies within the frame; a frame that does not follow the
schema raises WireFormatError (the fetcher treats that as a broken connection).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from exactly.protocol.primitives import Buffer, WireFormatError, read_uvarint, skip_tagged_fields

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_HEAD_V7 = struct.Struct(">iihi")  # correlation id, throttle time, error code, session id
_PART_V5 = struct.Struct(">ihqqq")  # index, error, high watermark, last stable offset, log start
_EPOCH_END = struct.Struct(">iq")  # diverging epoch: epoch, end offset
_ABORTED_SIZE = 16  # producer id, first offset
DIVERGING_EPOCH_TAG = 0


@dataclass(frozen=True, slots=True)
class FetchedPartition:
    """One partition of a fetch response; its records are ``frame[records_start:records_end]``."""

    topic: str
    partition: int
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    records_start: int
    records_end: int
    diverging_epoch: tuple[int, int] | None = None  # (epoch, end offset), v12+ only


@dataclass(frozen=True, slots=True)
class FetchResponseView:
    correlation_id: int
    error_code: int
    session_id: int
    partitions: tuple[FetchedPartition, ...]


def parse_fetch_response(frame: Buffer, version: int) -> FetchResponseView:
    """Read a Fetch response frame (without its size prefix), v7 and up."""
    if version < 7:
        raise ValueError(f"fetch response v{version} is not read here (v7+ only)")
    try:
        return _parse(frame, version)
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise WireFormatError(f"malformed fetch response: {exc}") from None


def _parse(buf: Buffer, version: int) -> FetchResponseView:
    flexible = version >= 12
    end = len(buf)
    if flexible:
        correlation = _I32.unpack_from(buf, 0)[0]
        pos = skip_tagged_fields(buf, 4)
        _throttle, error, session = struct.unpack_from(">ihi", buf, pos)
        pos += 10
    else:
        correlation, _throttle, error, session = _HEAD_V7.unpack_from(buf, 0)
        pos = _HEAD_V7.size
    out: list[FetchedPartition] = []
    n_topics, pos = _count(buf, pos, flexible)
    for _ in range(n_topics):
        topic, pos = _string(buf, pos, flexible)
        n_parts, pos = _count(buf, pos, flexible)
        for _ in range(n_parts):
            index, code, hw, lso, log_start = _PART_V5.unpack_from(buf, pos)
            pos += _PART_V5.size
            n_aborted, pos = _count(buf, pos, flexible)
            for _ in range(max(n_aborted, 0)):
                pos += _ABORTED_SIZE
                if flexible:
                    pos = skip_tagged_fields(buf, pos)
            if version >= 11:
                pos += 4  # preferred_read_replica
            if flexible:
                size, pos = read_uvarint(buf, pos)
                size -= 1
            else:
                size = _I32.unpack_from(buf, pos)[0]
                pos += 4
            size = max(size, 0)  # null records: nothing
            start = pos
            pos += size
            if pos > end:
                raise WireFormatError(f"records of {topic}-{index} run past the frame")
            diverging: tuple[int, int] | None = None
            if flexible:
                diverging, pos = _partition_tags(buf, pos)
            out.append(
                FetchedPartition(topic, index, code, hw, lso, log_start, start, start + size, diverging)
            )
        if flexible:
            pos = skip_tagged_fields(buf, pos)
    if flexible:
        pos = skip_tagged_fields(buf, pos)
    if pos > end:
        raise WireFormatError("fetch response runs past the frame")
    return FetchResponseView(correlation, error, session, tuple(out))


def _count(buf: Buffer, pos: int, flexible: bool) -> tuple[int, int]:
    """An array length; -1 for null."""
    if flexible:
        n, pos = read_uvarint(buf, pos)
        return n - 1, pos
    return _I32.unpack_from(buf, pos)[0], pos + 4


def _string(buf: Buffer, pos: int, flexible: bool) -> tuple[str, int]:
    if flexible:
        n, pos = read_uvarint(buf, pos)
        n -= 1
    else:
        n = _I16.unpack_from(buf, pos)[0]
        pos += 2
    if n < 0 or pos + n > len(buf):
        raise WireFormatError("bad topic name length")
    return bytes(buf[pos : pos + n]).decode(), pos + n


def _partition_tags(buf: Buffer, pos: int) -> tuple[tuple[int, int] | None, int]:
    """A partition's tagged fields: the diverging epoch if present, every other tag skipped."""
    count, pos = read_uvarint(buf, pos)
    diverging: tuple[int, int] | None = None
    for _ in range(count):
        tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        if tag == DIVERGING_EPOCH_TAG:
            epoch, end_offset = _EPOCH_END.unpack_from(buf, pos)
            diverging = (epoch, end_offset)
        pos += size
    if pos > len(buf):
        raise WireFormatError("tagged fields run past the frame")
    return diverging, pos
