"""Control batches: the COMMIT/ABORT transaction markers.

A marker is a one-record batch with the transactional and control attribute bits set, written by
the broker (never by clients) at the end of a transaction. Key: version int16 = 0, type int16
(ABORT 0, COMMIT 1). Value: version int16 = 0, coordinator epoch int32. The base sequence is -1:
markers take no part in the producer's sequence numbering.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from exactly.protocol.primitives import read_varint, read_varlong
from exactly.records.batch import HEADER_SIZE, BatchHeader, InvalidRecordError
from exactly.records.builder import Record, build_batch

_KEY = struct.Struct(">hh")
_VALUE = struct.Struct(">hi")


class ControlType(enum.IntEnum):
    ABORT = 0
    COMMIT = 1


@dataclass(frozen=True, slots=True)
class ControlMarker:
    type: ControlType
    coordinator_epoch: int


def build_control_batch(
    marker: ControlType,
    *,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int,
    timestamp: int,
    partition_leader_epoch: int = -1,
) -> bytes:
    record = Record(key=_KEY.pack(0, int(marker)), value=_VALUE.pack(0, coordinator_epoch))
    return build_batch(
        [record],
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=-1,
        transactional=True,
        control=True,
        base_timestamp=timestamp,
        partition_leader_epoch=partition_leader_epoch,
    )


def read_control_marker(buf: bytes | bytearray | memoryview, header: BatchHeader) -> ControlMarker:
    """Parse the single control record of a control batch without a full decode."""
    view = memoryview(buf)
    pos = header.position + HEADER_SIZE
    _length, pos = read_varint(view, pos)
    pos += 1  # record attributes
    _ts, pos = read_varlong(view, pos)
    _off, pos = read_varint(view, pos)
    key_len, pos = read_varint(view, pos)
    if key_len < 4:
        raise ValueError("control record key too short")
    _version, ctype = _KEY.unpack_from(view, pos)
    pos += key_len
    val_len, pos = read_varint(view, pos)
    coordinator_epoch = _VALUE.unpack_from(view, pos)[1] if val_len >= 6 else -1
    return ControlMarker(ControlType(ctype), coordinator_epoch)


_BY_VALUE = {int(t): t for t in ControlType}
# A marker's record as the broker writes it, up to its key's type: length (1 byte), attributes,
# timestamp delta 0, offset delta 0, key length 4 (zig-zag 8), key version int16, key type int16.
_MARKER_PREFIX = struct.Struct(">BbBBBhh")


def control_type(buf: bytes | bytearray | memoryview, header: BatchHeader) -> ControlType:
    """The type of a control batch's marker: what a coordinator's load needs of each of the many
    markers it replays. A record laid out as :func:`build_control_batch` writes it (every varint
    one byte) is read with one unpack; any other layout goes through :func:`read_control_marker`,
    with the same result and errors."""
    known = control_type_at(buf, header.position)
    return known if known is not None else read_control_marker(buf, header).type


def control_type_at(buf: bytes | bytearray | memoryview, position: int) -> ControlType | None:
    """:func:`control_type` of the control batch at ``position`` without its parsed header, or
    None when the marker is not in one of the two layouts read by unpacks alone (the caller
    then parses the header and calls :func:`control_type`). What a coordinator's load calls for
    each of its markers, most of its batches."""
    pos = position + HEADER_SIZE
    if pos + _MARKER_PREFIX.size <= len(buf):
        length, _attributes, ts_delta, offset_delta, key_len, _version, ctype = _MARKER_PREFIX.unpack_from(
            buf, pos
        )
        known = _BY_VALUE.get(ctype)
        if length < 0x80 and ts_delta == 0 and offset_delta == 0 and key_len == 8 and known is not None:
            return known
        # A marker the log cleaner rebuilt with a delete horizon: its timestamp delta (relative
        # to the horizon) takes several bytes. Skip the two leading varints by their continuation
        # bits; the rest as above.
        after_length = _skip_varint(buf, pos)
        at = _skip_varint(buf, after_length + 1) if after_length > 0 else -1  # + the attributes byte
        if at > 0 and at + 6 <= len(buf) and buf[at] == 0 and buf[at + 1] == 8:
            _version, ctype = _KEY.unpack_from(buf, at + 2)
            known = _BY_VALUE.get(ctype)
            if known is not None:
                return known
    return None


def _skip_varint(buf: bytes | bytearray | memoryview, pos: int) -> int:
    """The position after the varint at ``pos`` (at most 10 bytes); -1 past the buffer's end."""
    end = min(len(buf), pos + 10)
    while pos < end:
        if not buf[pos] & 0x80:
            return pos + 1
        pos += 1
    return -1


def marker_of(buf: bytes | bytearray | memoryview, header: BatchHeader) -> tuple[ControlType | None, int]:
    """(type, coordinator epoch) of a control batch's marker, (None, -1) for a data batch, as an
    append needs them. Raises InvalidRecordError(INVALID_RECORD) for an unreadable marker."""
    if not header.is_control:
        return None, -1
    try:
        marker = read_control_marker(buf, header)
    except (ValueError, IndexError) as exc:
        raise InvalidRecordError(ErrorCode.invalid_record, f"unreadable control batch: {exc}") from None
    return marker.type, marker.coordinator_epoch
