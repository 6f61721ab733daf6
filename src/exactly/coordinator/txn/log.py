"""Key/value codec for ``__transaction_state``, byte-compatible with Kafka.

The topic is compacted and keyed by transactional.id, so the newest record per key is the state of
that id; a null value (tombstone) means the id expired. Formats (Kafka's TransactionLogKey.json and
TransactionLogValue.json; all integers big-endian):

Key, version 0 (not flexible)::

    int16 version = 0 | string transactional_id (int16 length + UTF-8)

Value, version 0 (not flexible)::

    int16 version = 0 | int64 producer_id | int16 producer_epoch | int32 transaction_timeout_ms
    | int8 transaction_status | nullable array (int32 count, -1 = null) of
      {string topic, array (int32 count) of int32 partition}
    | int64 last_update_timestamp_ms | int64 start_timestamp_ms

Value, version 1 (flexible: compact lengths are unsigned varints of n + 1, 0 = null, and every
struct ends with a tagged-field section; a tagged field is written only when not at its default)::

    same fixed fields, compact nullable array of {compact string, compact int32 array, tags},
    then tags: 0 PreviousProducerId int64 (-1), 1 NextProducerId int64 (-1),
               2 ClientTransactionVersion int16 (0), 3 NextProducerEpoch int16 (-1)

Kafka writes a null partition array for ``Empty`` and ignores the array of an ``Empty`` value when
reading. Kafka with transaction version < 2 writes value version 0, Kafka 4 with TV2 writes 1; we
write version 1 by default because it keeps ``PreviousProducerId`` (KIP-360 retries after a
producer id rotation survive a restart) and every Kafka that knows TV2 reads it.
Unknown tags are skipped but kept, so decode -> encode is lossless.

Partitioning: ``partition_for`` is ``Utils.abs(transactionalId.hashCode()) % n`` with Java's
String.hashCode over UTF-16 code units and Kafka's ``Utils.abs`` (``abs(Integer.MIN_VALUE) = 0``,
unlike Math.abs). The same rule maps a consumer group to its ``__consumer_offsets`` partition.
"""

from __future__ import annotations

import struct
from collections import defaultdict
from dataclasses import dataclass

from exactly.coordinator.txn.metadata import TxnTransitMetadata
from exactly.coordinator.txn.state import TransactionState
from exactly.frozen import quick_init
from exactly.protocol.primitives import Reader, append_tagged_fields, append_uvarint
from exactly.topics import CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC
from exactly.types import NO_PRODUCER_EPOCH, ProducerEpoch, ProducerId, TopicPartition

DEFAULT_NUM_PARTITIONS = 50

KEY_VERSION = 0
VALUE_VERSIONS = (0, 1)
DEFAULT_VALUE_VERSION = 1

_TAG_PREVIOUS_PRODUCER_ID = 0
_TAG_NEXT_PRODUCER_ID = 1
_TAG_CLIENT_TRANSACTION_VERSION = 2
_TAG_NEXT_PRODUCER_EPOCH = 3

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_FIXED = struct.Struct(">qhib")  # producer id, epoch, timeout, status
_TIMES = struct.Struct(">qq")  # last update, start
# The known tagged fields' types, by tag: previous / next producer id, client transaction
# version, next producer epoch.
_TAG_STRUCTS = (_I64, _I64, _I16, _I16)
_KEY_HEAD = struct.Struct(">hh")  # key version, id length
_VALUE_HEAD = struct.Struct(">hqhibB")  # version, _FIXED, the v1 partition array's first byte


# -- partitioning ------------------------------------------------------------------------------


def java_string_hash(s: str) -> int:
    """Java's ``String.hashCode()``: 31-polynomial over UTF-16 code units, as a signed int32."""
    units = s.encode("utf-16-be")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + ((units[i] << 8) | units[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def _kafka_abs(n: int) -> int:
    """Kafka's ``Utils.abs``: like abs() but ``Integer.MIN_VALUE`` maps to 0, not to itself."""
    return 0 if n == -(2**31) else abs(n)


def partition_for(transactional_id: str, num_partitions: int = DEFAULT_NUM_PARTITIONS) -> int:
    """The ``__transaction_state`` partition (and so the coordinator) of a transactional.id."""
    return _kafka_abs(java_string_hash(transactional_id)) % num_partitions


def offsets_partition_for(group_id: str, num_partitions: int = DEFAULT_NUM_PARTITIONS) -> int:
    """The ``__consumer_offsets`` partition of a consumer group (AddOffsetsToTxn adds it)."""
    return _kafka_abs(java_string_hash(group_id)) % num_partitions


# -- wire model --------------------------------------------------------------------------------


@quick_init
@dataclass(frozen=True, slots=True)
class TransactionLogValue:
    """One ``__transaction_state`` value exactly as on the wire (field names from the JSON spec).

    ``partitions`` keeps the wire grouping ``((topic, (partition, ...)), ...)``; None is the null
    array. The tagged fields only exist from version 1 on.
    """

    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    transaction_status: int
    partitions: tuple[tuple[str, tuple[int, ...]], ...] | None
    last_update_timestamp_ms: int
    start_timestamp_ms: int
    previous_producer_id: int = -1
    next_producer_id: int = -1
    client_transaction_version: int = 0
    next_producer_epoch: int = -1
    unknown_tagged_fields: tuple[tuple[int, bytes], ...] = ()


@quick_init
@dataclass(frozen=True, slots=True)
class TxnLogRecord:
    """A decoded record: ``value`` None is a tombstone (the id expired)."""

    transactional_id: str
    value: TransactionLogValue | None


class UnknownVersionError(ValueError):
    """A key or value version this codec does not know (a newer writer, or another record type)."""


# -- primitives --------------------------------------------------------------------------------


def _expect_end(r: Reader) -> None:
    if not r.done():
        raise ValueError(f"{r.remaining()} trailing bytes in transaction log record")


def _string(s: str, out: bytearray, *, compact: bool) -> None:
    data = s.encode("utf-8")
    if compact:
        append_uvarint(len(data) + 1, out)
    else:
        if len(data) > 0x7FFF:
            raise ValueError("string longer than 32767 bytes")
        out += _I16.pack(len(data))
    out += data


def _read_string(r: Reader, *, compact: bool) -> str:
    n = r.uvarint() - 1 if compact else r.unpack(_I16)[0]
    if n < 0:
        raise ValueError("null string where a string is required")
    return bytes(r.take(n)).decode("utf-8")


def _array_length(n: int, out: bytearray, *, compact: bool) -> None:
    if compact:
        append_uvarint(n + 1, out)
    else:
        out += _I32.pack(n)


# -- key ---------------------------------------------------------------------------------------


def encode_key(transactional_id: str) -> bytes:
    out = bytearray(_I16.pack(KEY_VERSION))
    _string(transactional_id, out, compact=False)
    return bytes(out)


def decode_key(data: bytes | bytearray | memoryview) -> str:
    if len(data) >= 4:
        version, size = _KEY_HEAD.unpack_from(data)
        if version == KEY_VERSION and size >= 0 and len(data) == 4 + size:
            try:
                return str(data[4:], "utf-8")
            except UnicodeDecodeError:
                pass  # the generic reader raises its own error for it
    r = Reader(data)
    (version,) = r.unpack(_I16)
    if version != KEY_VERSION:
        raise UnknownVersionError(f"unknown transaction log key version {version}")
    transactional_id = _read_string(r, compact=False)
    _expect_end(r)
    return transactional_id


# -- value -------------------------------------------------------------------------------------


def encode_value(value: TransactionLogValue, version: int = DEFAULT_VALUE_VERSION) -> bytes:
    if version not in VALUE_VERSIONS:
        raise UnknownVersionError(f"unknown transaction log value version {version}")
    flexible = version >= 1
    out = bytearray(_I16.pack(version))
    out += _FIXED.pack(
        value.producer_id, value.producer_epoch, value.transaction_timeout_ms, value.transaction_status
    )
    parts = value.partitions
    if parts is None:
        out += b"\x00" if flexible else _I32.pack(-1)
    else:
        _array_length(len(parts), out, compact=flexible)
        for topic, ids in parts:
            _string(topic, out, compact=flexible)
            _array_length(len(ids), out, compact=flexible)
            for pid in ids:
                out += _I32.pack(pid)
            if flexible:
                out += b"\x00"  # no tagged fields in the nested struct
    out += _TIMES.pack(value.last_update_timestamp_ms, value.start_timestamp_ms)
    if flexible:
        tags = list(value.unknown_tagged_fields)
        if value.previous_producer_id != -1:
            tags.append((_TAG_PREVIOUS_PRODUCER_ID, _I64.pack(value.previous_producer_id)))
        if value.next_producer_id != -1:
            tags.append((_TAG_NEXT_PRODUCER_ID, _I64.pack(value.next_producer_id)))
        if value.client_transaction_version != 0:
            tags.append((_TAG_CLIENT_TRANSACTION_VERSION, _I16.pack(value.client_transaction_version)))
        if value.next_producer_epoch != -1:
            tags.append((_TAG_NEXT_PRODUCER_EPOCH, _I16.pack(value.next_producer_epoch)))
        append_tagged_fields(tags, out)
    return bytes(out)


def decode_value(data: bytes | bytearray | memoryview) -> TransactionLogValue:
    """Decode a value of a known version (else UnknownVersionError); malformed bytes raise."""
    quick = _quick_value(data)
    return quick if quick is not None else _decode_value(data)


def _quick_value(data: bytes | bytearray | memoryview) -> TransactionLogValue | None:
    """A v1 value (what this broker and Kafka 3.x write) whose compact lengths and tag numbers
    each fit one byte and whose tagged fields are known ones in order, read with unpacks alone; None for anything else, which
    :func:`_decode_value` then reads (same value, or its error). Why: a restart decodes every
    live transactional id's value, and the generic reader was most of that load's time."""
    size = len(data)
    if size < _VALUE_HEAD.size + _TIMES.size + 1:
        return None
    version, producer_id, epoch, timeout, status, count = _VALUE_HEAD.unpack_from(data)
    if version != 1 or count & 0x80:
        return None
    pos = _VALUE_HEAD.size
    partitions: tuple[tuple[str, tuple[int, ...]], ...] | None = None
    if count:
        groups = []
        for _ in range(count - 1):
            if pos >= size or data[pos] & 0x80 or not data[pos]:
                return None
            end = pos + data[pos]  # the topic's length + 1, after its length byte
            if end >= size or data[end] & 0x80 or not data[end]:
                return None
            n = data[end] - 1
            ids_end = end + 1 + 4 * n
            if ids_end >= size or data[ids_end]:  # its own tagged fields: none
                return None
            try:
                topic = str(data[pos + 1 : end], "utf-8")
            except UnicodeDecodeError:
                return None
            groups.append((topic, struct.unpack_from(f">{n}i", data, end + 1)))
            pos = ids_end + 1
        partitions = tuple(groups)
    if pos + _TIMES.size >= size:
        return None
    last_update, start = _TIMES.unpack_from(data, pos)
    pos += _TIMES.size
    tags = data[pos]
    if tags & 0x80:
        return None
    pos += 1
    fields = [-1, -1, 0, -1]  # the known tags' defaults, by tag
    previous = -1
    for _ in range(tags):
        if pos + 2 > size:
            return None
        tag, length = data[pos], data[pos + 1]
        if tag <= previous or tag >= len(fields) or length != _TAG_STRUCTS[tag].size:
            return None  # out of order, repeated, unknown or mis-sized: the generic reader's
        if pos + 2 + length > size:
            return None
        fields[tag] = _TAG_STRUCTS[tag].unpack_from(data, pos + 2)[0]
        previous = tag
        pos += 2 + length
    if pos != size:
        return None
    return TransactionLogValue(
        producer_id=producer_id,
        producer_epoch=epoch,
        transaction_timeout_ms=timeout,
        transaction_status=status,
        partitions=partitions,
        last_update_timestamp_ms=last_update,
        start_timestamp_ms=start,
        previous_producer_id=fields[_TAG_PREVIOUS_PRODUCER_ID],
        next_producer_id=fields[_TAG_NEXT_PRODUCER_ID],
        client_transaction_version=fields[_TAG_CLIENT_TRANSACTION_VERSION],
        next_producer_epoch=fields[_TAG_NEXT_PRODUCER_EPOCH],
    )


def _decode_value(data: bytes | bytearray | memoryview) -> TransactionLogValue:
    r = Reader(data)
    (version,) = r.unpack(_I16)
    if version not in VALUE_VERSIONS:
        raise UnknownVersionError(f"unknown transaction log value version {version}")
    flexible = version >= 1
    producer_id, epoch, timeout, status = r.unpack(_FIXED)
    count = r.uvarint() - 1 if flexible else r.unpack(_I32)[0]
    partitions: tuple[tuple[str, tuple[int, ...]], ...] | None = None
    if count >= 0:
        groups = []
        for _ in range(count):
            topic = _read_string(r, compact=flexible)
            n = r.uvarint() - 1 if flexible else r.unpack(_I32)[0]
            if n < 0:
                raise ValueError("null partition id array")
            ids = struct.unpack(f">{n}i", r.take(4 * n))
            if flexible:
                r.tagged_fields()  # no known tags in the nested struct
            groups.append((topic, tuple(ids)))
        partitions = tuple(groups)
    elif count != -1:
        raise ValueError(f"invalid partition array length {count}")
    last_update, start = r.unpack(_TIMES)
    tags = r.tagged_fields() if flexible else {}
    _expect_end(r)

    def tagged(tag: int, st: struct.Struct, default: int) -> int:
        payload = tags.pop(tag, None)
        if payload is None:
            return default
        if len(payload) != st.size:
            raise ValueError(f"tagged field {tag} has {len(payload)} bytes, expected {st.size}")
        return int(st.unpack(payload)[0])

    return TransactionLogValue(
        producer_id=producer_id,
        producer_epoch=epoch,
        transaction_timeout_ms=timeout,
        transaction_status=status,
        partitions=partitions,
        last_update_timestamp_ms=last_update,
        start_timestamp_ms=start,
        previous_producer_id=tagged(_TAG_PREVIOUS_PRODUCER_ID, _I64, -1),
        next_producer_id=tagged(_TAG_NEXT_PRODUCER_ID, _I64, -1),
        client_transaction_version=tagged(_TAG_CLIENT_TRANSACTION_VERSION, _I16, 0),
        next_producer_epoch=tagged(_TAG_NEXT_PRODUCER_EPOCH, _I16, -1),
        unknown_tagged_fields=tuple(sorted(tags.items())),
    )


def read_record(
    key: bytes | bytearray | memoryview, value: bytes | bytearray | memoryview | None
) -> TxnLogRecord | None:
    """Decode one ``__transaction_state`` record; None for versions we do not know.

    Unknown versions are skipped rather than fatal (as Kafka does since KIP-915), so a log
    written by a newer broker can still be loaded; malformed bytes of a known version raise.
    """
    try:
        transactional_id = decode_key(key)
        return TxnLogRecord(transactional_id, None if value is None else decode_value(value))
    except UnknownVersionError:
        return None


# -- transit <-> value -------------------------------------------------------------------------


def value_for_transit(
    transit: TxnTransitMetadata, version: int = DEFAULT_VALUE_VERSION
) -> TransactionLogValue:
    """The value Kafka writes for a transit; ``Dead`` has no value (it is written as a tombstone)."""
    if transit.state is TransactionState.DEAD:
        raise ValueError("Dead is written as a tombstone, not as a value")
    if transit.state is TransactionState.EMPTY and transit.partitions:
        raise ValueError(f"Empty transaction with partitions: {transit}")
    partitions = None
    if transit.state is not TransactionState.EMPTY:
        by_topic: defaultdict[str, list[int]] = defaultdict(list)
        for tp in transit.partitions:
            by_topic[tp.topic].append(tp.partition)
        partitions = tuple((topic, tuple(sorted(ids))) for topic, ids in sorted(by_topic.items()))
    flexible = version >= 1
    return TransactionLogValue(
        producer_id=transit.producer_id,
        producer_epoch=transit.producer_epoch,
        transaction_timeout_ms=transit.txn_timeout_ms,
        transaction_status=transit.state.id,
        partitions=partitions,
        last_update_timestamp_ms=transit.txn_last_update_timestamp,
        start_timestamp_ms=transit.txn_start_timestamp,
        previous_producer_id=transit.prev_producer_id if flexible else -1,
        next_producer_id=transit.next_producer_id if flexible else -1,
        client_transaction_version=transit.client_transaction_version if flexible else 0,
    )


def encode_transit(transit: TxnTransitMetadata, version: int = DEFAULT_VALUE_VERSION) -> bytes:
    return encode_value(value_for_transit(transit, version), version)


def transit_from_value(value: TransactionLogValue) -> TxnTransitMetadata:
    """What a loaded value means: the last epoch is not persisted, so it comes back as -1."""
    state = TransactionState.from_id(value.transaction_status)
    partitions: frozenset[TopicPartition] = frozenset()
    if state is not TransactionState.EMPTY and value.partitions is not None:
        partitions = frozenset(TopicPartition(topic, p) for topic, ids in value.partitions for p in ids)
    return TxnTransitMetadata(
        producer_id=ProducerId(value.producer_id),
        prev_producer_id=ProducerId(value.previous_producer_id),
        next_producer_id=ProducerId(value.next_producer_id),
        producer_epoch=ProducerEpoch(value.producer_epoch),
        last_producer_epoch=NO_PRODUCER_EPOCH,
        txn_timeout_ms=value.transaction_timeout_ms,
        state=state,
        partitions=partitions,
        txn_start_timestamp=value.start_timestamp_ms,
        txn_last_update_timestamp=value.last_update_timestamp_ms,
        client_transaction_version=value.client_transaction_version,
    )


__all__ = [
    "CONSUMER_OFFSETS_TOPIC",
    "DEFAULT_NUM_PARTITIONS",
    "DEFAULT_VALUE_VERSION",
    "TRANSACTION_STATE_TOPIC",
    "TransactionLogValue",
    "TxnLogRecord",
    "UnknownVersionError",
    "decode_key",
    "decode_value",
    "encode_key",
    "encode_transit",
    "encode_value",
    "java_string_hash",
    "offsets_partition_for",
    "partition_for",
    "read_record",
    "transit_from_value",
    "value_for_transit",
]
