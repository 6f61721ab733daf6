"""Rebuilding a stored v2 batch with fewer records: what the log cleaner writes (Kafka's
MemoryRecords.filterTo / buildRetainedRecordsInto / DefaultRecordBatch.writeEmptyHeader).

Why a module of its own: the broker's produce and fetch paths never rebuild a batch; only the
cleaner, off those paths, decodes a batch, keeps some of its records and writes them back. The
rebuilt batch keeps everything a reader or the producer state can rely on:

* the base offset and the *last offset* (``lastOffsetDelta`` is copied, not recomputed), so the
  producer's last sequence (``baseSequence + lastOffsetDelta``) survives even when the record
  holding it is gone, and offsets never change;
* the producer id, epoch, base sequence, partition leader epoch, transactional and control flags
  and the timestamp type;
* each kept record's own offset (its delta from the base offset) and timestamp.

With a *delete horizon* (KIP-534) the batch's base timestamp holds the horizon and attribute bit 6
says so; record timestamps are then deltas from the horizon (they may be negative), so decoding
still yields each record's original timestamp.

An *empty* batch (``build_empty_batch``) is the 61-byte header alone with zero records: it keeps a
producer's last sequence and epoch in the log after all its records were cleaned away.
"""

from __future__ import annotations

import gzip
import struct
from collections.abc import Callable, Iterator, Sequence

import crc32c

from exactly.protocol.primitives import read_varint, read_varlong
from exactly.records.batch import (
    COMPRESSION_MASK,
    CONTROL_FLAG,
    DELETE_HORIZON_FLAG,
    HEADER_SIZE,
    LOG_OVERHEAD,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_FLAG,
    BatchHeader,
)
from exactly.records.builder import COMPRESSION_GZIP, Record, encode_records, record_payload

_PREFIX = struct.Struct(">qiibI")
_AFTER_CRC = struct.Struct(">hiqqqhii")


def delete_horizon_of(header: BatchHeader) -> int | None:
    """The batch's delete horizon (ms) when attribute bit 6 says its base timestamp holds one."""
    if header.attributes & DELETE_HORIZON_FLAG:
        return header.base_timestamp
    return None


def _assemble(
    header: BatchHeader, attributes: int, base_ts: int, max_ts: int, count: int, payload: bytes
) -> bytes:
    after_crc = (
        _AFTER_CRC.pack(
            attributes,
            header.last_offset_delta,
            base_ts,
            max_ts,
            header.producer_id,
            header.producer_epoch,
            header.base_sequence,
            count,
        )
        + payload
    )
    batch_length = HEADER_SIZE - LOG_OVERHEAD + len(payload)
    crc = crc32c.crc32c(after_crc)
    return _PREFIX.pack(header.base_offset, batch_length, header.partition_leader_epoch, 2, crc) + after_crc


def build_retained_batch(
    header: BatchHeader,
    records: Sequence[Record],
    *,
    delete_horizon_ms: int | None,
    tick: Callable[[], None] | None = None,
) -> bytes:
    """The batch ``header`` describes, holding only ``records`` (decoded from it, with their
    offsets and absolute timestamps). Same compression as the original (uncompressed or gzip).
    ``delete_horizon_ms`` sets bit 6 and the base timestamp; None leaves both unset. ``tick``:
    called while the records are encoded (``builder.encode_records``)."""
    if not records:
        raise ValueError("a retained batch needs a record; use build_empty_batch")
    compression = header.attributes & COMPRESSION_MASK
    if compression not in (0, COMPRESSION_GZIP):
        raise ValueError(f"cannot rebuild a batch with compression codec {compression}")
    timestamps = [header.base_timestamp if r.timestamp is None else r.timestamp for r in records]
    attributes = header.attributes & (
        COMPRESSION_MASK | TIMESTAMP_TYPE_MASK | TRANSACTIONAL_FLAG | CONTROL_FLAG
    )
    if delete_horizon_ms is not None:
        attributes |= DELETE_HORIZON_FLAG
        base_ts = delete_horizon_ms
    else:
        base_ts = timestamps[0]
    # LogAppendTime batches keep the broker's append time as their max timestamp.
    max_ts = header.max_timestamp if header.attributes & TIMESTAMP_TYPE_MASK else max(timestamps)
    payload = encode_records(records, base_ts, header.base_offset, tick=tick)
    if compression == COMPRESSION_GZIP:
        payload = gzip.compress(payload)
    return _assemble(header, attributes, base_ts, max_ts, len(records), payload)


def build_empty_batch(header: BatchHeader) -> bytes:
    """Header only, no records (Kafka's writeEmptyHeader): same offsets, producer id, epoch, base
    sequence, leader epoch, flags and timestamp type; uncompressed; both timestamps are the
    original max timestamp; no delete horizon."""
    attributes = header.attributes & (TIMESTAMP_TYPE_MASK | TRANSACTIONAL_FLAG | CONTROL_FLAG)
    return _assemble(header, attributes, header.max_timestamp, header.max_timestamp, 0, b"")


def record_keys(buf: bytes | memoryview, header: BatchHeader) -> Iterator[tuple[int, bytes | None]]:
    """(offset, key) of each record of the batch at ``header.position``, skipping values and
    headers: what building the cleaner's offset map needs, at about half the cost of a full decode.
    Uncompressed and gzip batches; raises ValueError for another codec."""
    for offset, key, _tombstone in record_key_states(buf, header):
        yield offset, key


def record_key_states(
    buf: bytes | memoryview, header: BatchHeader
) -> Iterator[tuple[int, bytes | None, bool]]:
    """(offset, key, is_tombstone) of each record, skipping values and headers: what the cleaner's
    per-record retain decision needs, so a batch that is kept whole or dropped whole is never fully
    decoded. Same codecs and errors as :func:`record_keys`."""
    payload = record_payload(buf, header)
    pos = 0
    for _ in range(header.record_count):
        length, pos = read_varint(payload, pos)
        end = pos + length
        _ts, cursor = read_varlong(payload, pos + 1)  # after the record attributes
        delta, cursor = read_varint(payload, cursor)
        key_len, cursor = read_varint(payload, cursor)
        if key_len < 0:
            key = None
        else:
            key = bytes(payload[cursor : cursor + key_len])
            cursor += key_len
        value_len, _ = read_varint(payload, cursor)
        yield header.base_offset + delta, key, value_len < 0
        pos = end
