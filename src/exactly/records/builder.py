"""Build and decode v2 record batches.

The broker itself only builds control batches (transaction markers); everything else here is for
tests, the CLI and tools that need to craft batches with chosen producer ids and sequences.
Decoding supports uncompressed and gzip batches (what the CLI and tests need); the broker never
decodes records on its produce or fetch paths.
"""

from __future__ import annotations

import gzip
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import crc32c

from exactly.protocol.primitives import (
    WireFormatError,
    append_varint,
    append_varlong,
    read_varint,
    read_varlong,
)
from exactly.records.batch import (
    COMPRESSION_MASK,
    CONTROL_FLAG,
    HEADER_SIZE,
    LOG_OVERHEAD,
    TRANSACTIONAL_FLAG,
    BatchHeader,
)

_HEADER_AFTER_CRC = struct.Struct(">hiqqqhii")
_PREFIX = struct.Struct(">qiib")

COMPRESSION_GZIP = 1


@dataclass(frozen=True, slots=True)
class Record:
    """One record as a client sees it."""

    value: bytes | None
    key: bytes | None = None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    timestamp: int | None = None  # absolute ms; None -> the batch's base timestamp
    offset: int = -1  # filled in by decode_batch


def _bytes_field(data: bytes | None, out: bytearray) -> None:
    if data is None:
        append_varint(-1, out)
    else:
        append_varint(len(data), out)
        out += data


#: Records between two calls of a ``tick`` given to ``encode_records`` / ``decode_batch``.
TICK_EVERY = 32


def encode_records(
    records: Sequence[Record],
    base_timestamp: int,
    base_offset: int | None = None,
    *,
    tick: Callable[[], None] | None = None,
) -> bytes:
    """The records section of a batch. Offset deltas count from 0, or, with ``base_offset``, are
    each record's ``offset - base_offset`` (a cleaned batch keeps its records' offsets).

    ``tick`` is called every ``TICK_EVERY`` records: the log cleaner's worker gives up its CPU
    there when its duty cycle says so (a 1 MB batch of 100 B records is ~10 ms to encode)."""
    out = bytearray()
    for index, record in enumerate(records):
        if tick is not None and index % TICK_EVERY == TICK_EVERY - 1:
            tick()
        delta = index if base_offset is None else record.offset - base_offset
        body = bytearray(b"\x00")  # record attributes (unused)
        ts = base_timestamp if record.timestamp is None else record.timestamp
        append_varlong(ts - base_timestamp, body)
        append_varint(delta, body)
        _bytes_field(record.key, body)
        _bytes_field(record.value, body)
        append_varint(len(record.headers), body)
        for name, hvalue in record.headers:
            encoded = name.encode()
            append_varint(len(encoded), body)
            body += encoded
            _bytes_field(hvalue, body)
        append_varint(len(body), out)
        out += body
    return bytes(out)


def build_batch(
    records: Sequence[Record],
    *,
    base_offset: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
    control: bool = False,
    base_timestamp: int = 0,
    partition_leader_epoch: int = -1,
    compression: int = 0,
) -> bytes:
    """Encode a complete v2 batch with a valid CRC32C."""
    if not records:
        raise ValueError("a batch needs at least one record")
    timestamps = [base_timestamp if r.timestamp is None else r.timestamp for r in records]
    max_timestamp = max(timestamps)
    payload = encode_records(records, base_timestamp)
    if compression == COMPRESSION_GZIP:
        payload = gzip.compress(payload)
    elif compression != 0:
        raise ValueError(f"unsupported compression {compression}")
    attributes = compression
    if transactional:
        attributes |= TRANSACTIONAL_FLAG
    if control:
        attributes |= CONTROL_FLAG
    after_crc = (
        _HEADER_AFTER_CRC.pack(
            attributes,
            len(records) - 1,
            base_timestamp,
            max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            len(records),
        )
        + payload
    )
    crc = crc32c.crc32c(after_crc)
    batch_length = HEADER_SIZE - LOG_OVERHEAD + len(payload)
    return (
        _PREFIX.pack(base_offset, batch_length, partition_leader_epoch, 2)
        + struct.pack(">I", crc)
        + after_crc
    )


def record_payload(buf: bytes | memoryview, header: BatchHeader) -> bytes | memoryview:
    """The records of the batch ``header`` describes, after its 61-byte header: a view of ``buf``
    when uncompressed, the decompressed bytes for gzip. Raises ValueError for another codec."""
    payload: bytes | memoryview = memoryview(buf)[
        header.position + HEADER_SIZE : header.position + header.size
    ]
    compression = header.attributes & COMPRESSION_MASK
    if compression == COMPRESSION_GZIP:
        return gzip.decompress(payload)
    if compression != 0:
        raise ValueError(f"cannot decode compression codec {compression}")
    return payload


def decode_batch(
    buf: bytes | memoryview, position: int = 0, *, tick: Callable[[], None] | None = None
) -> tuple[BatchHeader, list[Record]]:
    """Decode every record of the batch at ``position`` (uncompressed or gzip), calling ``tick``
    every ``TICK_EVERY`` records (see ``encode_records``; a 1 MB batch of 100 B records is
    ~40 ms to decode)."""
    header = BatchHeader.parse(buf, position)
    payload = bytes(record_payload(buf, header))  # the records' keys and values are bytes
    records: list[Record] = []
    pos = 0
    for index in range(header.record_count):
        if tick is not None and index % TICK_EVERY == TICK_EVERY - 1:
            tick()
        length, pos = read_varint(payload, pos)
        rec_end = pos + length
        pos += 1  # attributes
        ts_delta, pos = read_varlong(payload, pos)
        off_delta, pos = read_varint(payload, pos)
        key_len, pos = read_varint(payload, pos)
        key = None if key_len < 0 else bytes(payload[pos : pos + key_len])
        pos += max(key_len, 0)
        val_len, pos = read_varint(payload, pos)
        value = None if val_len < 0 else bytes(payload[pos : pos + val_len])
        pos += max(val_len, 0)
        n_headers, pos = read_varint(payload, pos)
        headers: list[tuple[str, bytes | None]] = []
        for _h in range(n_headers):
            hk_len, pos = read_varint(payload, pos)
            hk = bytes(payload[pos : pos + hk_len]).decode()
            pos += hk_len
            hv_len, pos = read_varint(payload, pos)
            hv = None if hv_len < 0 else bytes(payload[pos : pos + hv_len])
            pos += max(hv_len, 0)
            headers.append((hk, hv))
        pos = rec_end
        records.append(
            Record(
                value=value,
                key=key,
                headers=tuple(headers),
                timestamp=header.base_timestamp + ts_delta,
                offset=header.base_offset + off_delta,
            )
        )
    return header, records


def record_key_values(
    buf: bytes | memoryview, header: BatchHeader
) -> tuple[tuple[int, bytes | None, bytes | None], ...]:
    """(offset, key, value) of each record of the batch ``header`` describes, skipping timestamps
    and headers and building no :class:`Record`: what a coordinator's load replays, for every
    batch of its partitions, so it stays the cheapest full read. Same codecs and errors as
    :func:`decode_batch`; the values are exactly what it would give."""
    return payload_key_values(record_payload(buf, header), header.base_offset, header.record_count)


def payload_key_values(
    payload: bytes | memoryview, base_offset: int, record_count: int
) -> tuple[tuple[int, bytes | None, bytes | None], ...]:
    """:func:`record_key_values` of a batch's (uncompressed or decompressed) ``payload``, the
    records after its 61-byte header: a load's walk calls it directly for an uncompressed batch,
    without parsing a :class:`BatchHeader`. A varint of one byte (nearly every one a coordinator
    writes) is read inline; longer ones by :func:`read_varint`, so the values and the errors are
    the same (a varint past the end raises WireFormatError, as the reader does)."""
    out: list[tuple[int, bytes | None, bytes | None]] = []
    pos = 0
    try:
        for _ in range(record_count):
            v = payload[pos]
            if v < 0x80:
                length, pos = (v >> 1) ^ -(v & 1), pos + 1
            else:
                length, pos = read_varint(payload, pos)
            rec_end = pos + length
            cursor = pos + 1  # after the record attributes
            if payload[cursor] < 0x80:  # the timestamp delta, not needed
                cursor += 1
            else:
                cursor = read_varlong(payload, cursor)[1]
            v = payload[cursor]
            if v < 0x80:
                delta, cursor = (v >> 1) ^ -(v & 1), cursor + 1
            else:
                delta, cursor = read_varint(payload, cursor)
            v = payload[cursor]
            if v < 0x80:
                key_len, cursor = (v >> 1) ^ -(v & 1), cursor + 1
            else:
                key_len, cursor = read_varint(payload, cursor)
            key = None
            if key_len >= 0:
                key = bytes(payload[cursor : cursor + key_len])
                cursor += key_len
            v = payload[cursor]
            if v < 0x80:
                value_len, cursor = (v >> 1) ^ -(v & 1), cursor + 1
            else:
                value_len, cursor = read_varint(payload, cursor)
            value = None if value_len < 0 else bytes(payload[cursor : cursor + value_len])
            out.append((base_offset + delta, key, value))
            pos = rec_end
    except IndexError:
        raise WireFormatError("truncated varint") from None
    return tuple(out)
