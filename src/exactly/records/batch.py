"""Record batch v2 headers, read in place.

Theory of operation
-------------------
The broker never decodes individual records on the hot path. A record batch (magic 2) starts
with a fixed 61-byte header that says everything the broker needs: where the batch ends, how many
offsets it spans, who produced it (producer id, epoch, base sequence) and whether it is
transactional or a control batch. ``BatchHeader.parse`` reads that header with one
``struct.unpack_from`` call; ``validate_produce_records`` checks what Kafka's LogValidator checks
without touching the records themselves (magic, sizes, CRC32C over attributes..end).

Invariants
----------
* The CRC32C covers bytes ``[21, 12 + batch_length)`` (attributes to the end). Base offset and
  partition leader epoch lie before it, so the broker can patch both in place without
  recomputing the checksum (``patch_base_offset``, ``patch_partition_leader_epoch``).
* ``size == batch_length + 12`` (the base offset and the length field itself).
* Magic sits at byte 16 in every message format (v0/v1 message sets too), which is how old
  formats are recognised and refused.

Layout (big-endian)::

    0  baseOffset int64          27 baseTimestamp int64
    8  batchLength int32         35 maxTimestamp int64
    12 partitionLeaderEpoch int32 43 producerId int64
    16 magic int8                51 producerEpoch int16
    17 crc uint32                53 baseSequence int32
    21 attributes int16          57 recordsCount int32
    23 lastOffsetDelta int32     61 records...
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

import crc32c
from kio.schema.errors import ErrorCode

from exactly.frozen import quick_init

HEADER_SIZE = 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: bytes not counted by batchLength
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
MAX_TIMESTAMP_OFFSET = 35
# The smallest batchLength a v2 batch can have (header without the 12-byte log overhead).
MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20
DELETE_HORIZON_FLAG = 0x40

_HEADER = struct.Struct(">qiibIhiqqqhii")
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_OFFSET_LENGTH_EPOCH = struct.Struct(">qii")  # base offset, batch length, partition leader epoch


class InvalidRecordError(Exception):
    """A batch failed validation; ``error_code`` is what Kafka answers for it."""

    def __init__(self, error_code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


@quick_init
@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The 61-byte v2 batch header; ``position`` is where the batch starts in its buffer."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    position: int = 0

    @classmethod
    def parse(cls, buf: bytes | bytearray | memoryview, position: int = 0) -> BatchHeader:
        """Read a header at ``position``; the caller guarantees 61 bytes are there.

        Every batch read (appends, fetches, recovery, coordinator loads) parses one: one
        ``unpack_from`` and the ``quick_init`` constructor (each slot stored through its
        descriptor, not the frozen ``__init__``'s ``object.__setattr__`` per field)."""
        # _HEADER yields the 13 fields before ``position``, in declaration order
        return cls(*_HEADER.unpack_from(buf, position), position)  # type: ignore[call-arg]

    @property
    def size(self) -> int:
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG)

    @property
    def last_sequence(self) -> int:
        """Sequence of the last record; sequences wrap at Int32 max as in Kafka."""
        if self.base_sequence < 0:
            return -1
        return increment_sequence(self.base_sequence, self.last_offset_delta)

    def with_base_offset(self, base_offset: int) -> BatchHeader:
        return BatchHeader(
            base_offset,
            self.batch_length,
            self.partition_leader_epoch,
            self.magic,
            self.crc,
            self.attributes,
            self.last_offset_delta,
            self.base_timestamp,
            self.max_timestamp,
            self.producer_id,
            self.producer_epoch,
            self.base_sequence,
            self.record_count,
            self.position,
        )


def increment_sequence(sequence: int, increment: int) -> int:
    """Kafka's DefaultRecordBatch.incrementSequence: wrap past Int32 max back to 0."""
    if sequence > 2**31 - 1 - increment:
        return increment - (2**31 - 1 - sequence) - 1
    return sequence + increment


def compute_crc(buf: bytes | bytearray | memoryview, position: int, size: int) -> int:
    """CRC32C over attributes..end of the batch at ``position`` of total ``size`` bytes."""
    with memoryview(buf) as view:
        return int(crc32c.crc32c(view[position + ATTRIBUTES_OFFSET : position + size]))


def first_corrupt(buf: bytes | bytearray | memoryview, headers: Iterable[BatchHeader]) -> BatchHeader | None:
    """The first of ``headers`` (positions absolute in ``buf``) whose CRC32C does not match its
    bytes, or None. A follower checks every replicated batch before appending any, as Kafka's
    ``UnifiedLog.analyzeAndValidateRecords`` does for every append origin (replication included)."""
    with memoryview(buf) as view:
        for header in headers:
            start = header.position
            if crc32c.crc32c(view[start + ATTRIBUTES_OFFSET : start + header.size]) != header.crc:
                return header
    return None


def validate_produce_records(records: bytes | bytearray | memoryview) -> BatchHeader:
    """Validate a Produce request's records for one partition, as Kafka does for Produce v3+.

    Kafka requires exactly one v2 batch per partition (ProduceRequest.validateRecords), with a
    valid CRC and a consistent size. Returns the batch header (base offset as the client sent it).

    Raises InvalidRecordError with Kafka's error code:
      * old magic (v0/v1 message sets) -> UNSUPPORTED_FOR_MESSAGE_FORMAT
      * no batch, more than one batch, or inconsistent counts -> INVALID_RECORD
      * truncated batch or CRC mismatch -> CORRUPT_MESSAGE
    """
    total = len(records)
    if total < LOG_OVERHEAD + 5:
        raise InvalidRecordError(ErrorCode.invalid_record, "produce request has no record batch")
    magic = records[MAGIC_OFFSET]
    if magic != 2:
        raise InvalidRecordError(
            ErrorCode.unsupported_for_message_format,
            f"record batches with magic {magic} are not supported; only magic 2",
        )
    if total < HEADER_SIZE:
        raise InvalidRecordError(ErrorCode.corrupt_message, "record batch header is truncated")
    header = BatchHeader.parse(records, 0)
    size = header.size
    if header.batch_length < MIN_BATCH_LENGTH or size > total:
        raise InvalidRecordError(
            ErrorCode.corrupt_message,
            f"record batch length {header.batch_length} does not fit the {total} bytes sent",
        )
    if size < total:
        raise InvalidRecordError(
            ErrorCode.invalid_record,
            "produce requests v3+ may contain exactly one record batch per partition",
        )
    if compute_crc(records, 0, size) != header.crc:
        raise InvalidRecordError(ErrorCode.corrupt_message, "record batch CRC32C mismatch")
    if header.record_count <= 0 or header.last_offset_delta != header.record_count - 1:
        raise InvalidRecordError(
            ErrorCode.invalid_record,
            f"record count {header.record_count} does not match last offset delta {header.last_offset_delta}",
        )
    if header.is_control:
        raise InvalidRecordError(ErrorCode.invalid_record, "clients may not produce control batches")
    return header


def patch_base_offset(buf: bytearray | memoryview, position: int, base_offset: int) -> None:
    """Assign offsets to a batch by overwriting its base offset (not covered by the CRC)."""
    _INT64.pack_into(buf, position, base_offset)


def patch_partition_leader_epoch(buf: bytearray | memoryview, position: int, epoch: int) -> None:
    _INT32.pack_into(buf, position + 12, epoch)


def patch_offset_and_epoch(
    buf: bytearray | memoryview, header: BatchHeader, base_offset: int, epoch: int
) -> None:
    """``patch_base_offset`` and ``patch_partition_leader_epoch`` in one write (the batch length
    between them is rewritten with its own value): what every client append does."""
    _OFFSET_LENGTH_EPOCH.pack_into(buf, header.position, base_offset, header.batch_length, epoch)


def stamp_log_append_time(batch: bytearray | memoryview, header: BatchHeader, now_ms: int) -> BatchHeader:
    """message.timestamp.type=LogAppendTime: set the timestamp-type bit and the max timestamp to
    the broker's clock and recompute the CRC (both fields are covered by it), as Kafka does."""
    position = header.position
    attributes = header.attributes | TIMESTAMP_TYPE_MASK
    batch[position + ATTRIBUTES_OFFSET : position + ATTRIBUTES_OFFSET + 2] = attributes.to_bytes(2, "big")
    batch[position + MAX_TIMESTAMP_OFFSET : position + MAX_TIMESTAMP_OFFSET + 8] = now_ms.to_bytes(
        8, "big", signed=True
    )
    crc = compute_crc(batch, position, header.size)
    batch[position + CRC_OFFSET : position + CRC_OFFSET + 4] = crc.to_bytes(4, "big")
    return replace(header, attributes=attributes, max_timestamp=now_ms, crc=crc)


def iter_batches(
    buf: bytes | bytearray | memoryview, start: int = 0, end: int | None = None, *, verify_crc: bool = False
) -> Iterator[BatchHeader]:
    """Yield the headers of the whole, valid v2 batches in ``buf[start:end]``, stopping at the
    first incomplete or invalid one (a torn tail). ``position`` of each header is absolute in buf.

    Used by recovery (with ``verify_crc``) and by the fetch path (without: stored batches were
    checked when appended).
    """
    limit = len(buf) if end is None else end
    pos = start
    while pos + HEADER_SIZE <= limit:
        header = BatchHeader.parse(buf, pos)
        if header.magic != 2 or header.batch_length < MIN_BATCH_LENGTH:
            return
        if pos + header.size > limit:
            return
        if verify_crc and compute_crc(buf, pos, header.size) != header.crc:
            return
        yield header
        pos += header.size
