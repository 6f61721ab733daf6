"""__transaction_state codec: exact bytes, round trips, robustness, and Java-hash partitioning."""

from __future__ import annotations

import dataclasses
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exactly.coordinator.txn.log import (
    TransactionLogValue,
    UnknownVersionError,
    decode_key,
    decode_value,
    encode_key,
    encode_transit,
    encode_value,
    java_string_hash,
    offsets_partition_for,
    partition_for,
    read_record,
    transit_from_value,
    value_for_transit,
)
from exactly.coordinator.txn.log import _decode_value as generic_decode_value
from exactly.coordinator.txn.log import _quick_value as quick_value
from exactly.coordinator.txn.metadata import TxnTransitMetadata
from exactly.coordinator.txn.state import TransactionState
from exactly.types import ProducerEpoch, ProducerId, TopicPartition

S = TransactionState

# -- partitioning -------------------------------------------------------------------------------

# Computed with OpenJDK 17 (jshell): s.hashCode() and Utils.abs(hash) % 50.
JAVA_VALUES = [
    ("", 0, 0),
    ("a", 97, 47),
    ("hello", 99162322, 22),
    ("my-transactional-id", -959806496, 46),
    ("polygenelubricants", -(2**31), 0),  # Integer.MIN_VALUE: Kafka's Utils.abs gives 0
    ("txn-0", 110810509, 9),
    ("spark-query-1-partition-7", -4885693, 43),
    ("Ärger-ü", 1219028309, 9),
    ("\U0001f600emoji", -1233692477, 27),  # a surrogate pair: two UTF-16 code units
    ("my-group", -1906497762, 12),
]


def reference_hash(s: str) -> int:
    """Java's String.hashCode written the long way: explicit surrogates, exact powers of 31."""
    units: list[int] = []
    for ch in s:
        cp = ord(ch)
        if cp >= 0x10000:
            cp -= 0x10000
            units += [0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF)]
        else:
            units.append(cp)
    n = len(units)
    total = sum(u * 31 ** (n - 1 - i) for i, u in enumerate(units)) % 2**32
    return total - 2**32 if total >= 2**31 else total


@pytest.mark.parametrize(("s", "java_hash", "partition"), JAVA_VALUES)
def test_java_hash_and_partition_match_jvm(s: str, java_hash: int, partition: int) -> None:
    assert java_string_hash(s) == java_hash
    assert reference_hash(s) == java_hash
    assert partition_for(s) == partition
    assert offsets_partition_for(s) == partition


def test_min_value_hash_is_not_negative_partition() -> None:
    # Python's abs(-2**31) % 50 would be 48; Kafka's Utils.abs maps MIN_VALUE to 0.
    assert abs(-(2**31)) % 50 == 48
    assert partition_for("polygenelubricants") == 0
    assert partition_for("polygenelubricants", 7) == 0


@given(st.text(max_size=40), st.integers(min_value=1, max_value=200))
def test_hash_matches_reference(s: str, n: int) -> None:
    h = java_string_hash(s)
    assert h == reference_hash(s)
    assert -(2**31) <= h < 2**31
    assert 0 <= partition_for(s, n) < n


# -- exact bytes --------------------------------------------------------------------------------


def test_key_bytes() -> None:
    assert encode_key("txn") == b"\x00\x00\x00\x03txn"
    assert decode_key(b"\x00\x00\x00\x03txn") == "txn"


VALUE = TransactionLogValue(
    producer_id=1000,
    producer_epoch=2,
    transaction_timeout_ms=60_000,
    transaction_status=1,
    partitions=(("t", (0, 1)),),
    last_update_timestamp_ms=5,
    start_timestamp_ms=4,
    previous_producer_id=999,
)

V0_BYTES = (
    b"\x00\x00"  # version 0
    + struct.pack(">qhib", 1000, 2, 60_000, 1)
    + b"\x00\x00\x00\x01"  # one topic
    + b"\x00\x01t"  # int16-length string
    + b"\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x01"  # [0, 1]
    + struct.pack(">qq", 5, 4)
)

V1_BYTES = (
    b"\x00\x01"  # version 1
    + struct.pack(">qhib", 1000, 2, 60_000, 1)
    + b"\x02"  # compact array: 1 topic
    + b"\x02t"  # compact string
    + b"\x03\x00\x00\x00\x00\x00\x00\x00\x01"  # compact [0, 1]
    + b"\x00"  # nested struct: no tagged fields
    + struct.pack(">qq", 5, 4)
    + b"\x01\x00\x08"  # one tagged field: tag 0 (PreviousProducerId), 8 bytes
    + struct.pack(">q", 999)
)


def test_value_v0_bytes() -> None:
    assert encode_value(VALUE, 0) == V0_BYTES  # tagged fields do not exist in v0
    assert decode_value(V0_BYTES) == dataclasses.replace(VALUE, previous_producer_id=-1)


def test_value_v1_bytes() -> None:
    assert encode_value(VALUE, 1) == V1_BYTES
    assert decode_value(V1_BYTES) == VALUE


def test_empty_state_writes_null_partition_array() -> None:
    transit = _transit(S.EMPTY, partitions=frozenset())
    v0 = encode_transit(transit, 0)
    v1 = encode_transit(transit, 1)
    assert v0[2 + 15 : 2 + 19] == b"\xff\xff\xff\xff"
    assert v1[2 + 15] == 0
    assert decode_value(v0).partitions is None and decode_value(v1).partitions is None


def test_all_tags_round_trip_in_order() -> None:
    value = TransactionLogValue(
        1, 0, 1, 4, (), 0, 0, previous_producer_id=3, next_producer_id=4, client_transaction_version=2,
        next_producer_epoch=5, unknown_tagged_fields=((9, b"xyz"),),
    )  # fmt: skip
    data = encode_value(value, 1)
    # tags 0, 1, 2, 3, 9 in ascending order after the fixed fields and the empty array
    assert data[2 + 15 :].startswith(b"\x01" + struct.pack(">qq", 0, 0) + b"\x05\x00\x08")
    assert decode_value(data) == value


# -- round trips --------------------------------------------------------------------------------

int16 = st.integers(-(2**15), 2**15 - 1)
int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)
topics = st.text(min_size=1, max_size=20)
partition_groups = st.lists(st.tuples(topics, st.lists(int32, max_size=5).map(tuple)), max_size=4).map(tuple)


@st.composite
def log_values(draw: st.DrawFn, flexible: bool) -> TransactionLogValue:
    tags = {}
    if flexible:
        tags = {
            "previous_producer_id": draw(int64),
            "next_producer_id": draw(int64),
            "client_transaction_version": draw(int16),
            "next_producer_epoch": draw(int16),
            "unknown_tagged_fields": tuple(
                sorted(draw(st.dictionaries(st.integers(4, 300), st.binary(max_size=10), max_size=3)).items())
            ),
        }
    return TransactionLogValue(
        producer_id=draw(int64),
        producer_epoch=draw(int16),
        transaction_timeout_ms=draw(int32),
        transaction_status=draw(st.integers(-128, 127)),
        partitions=draw(st.none() | partition_groups),
        last_update_timestamp_ms=draw(int64),
        start_timestamp_ms=draw(int64),
        **tags,
    )


@given(log_values(flexible=False))
def test_value_v0_round_trip(value: TransactionLogValue) -> None:
    assert decode_value(encode_value(value, 0)) == value


@given(log_values(flexible=True))
def test_value_v1_round_trip(value: TransactionLogValue) -> None:
    assert decode_value(encode_value(value, 1)) == value


@given(log_values(flexible=True))
def test_quick_read_of_written_values_equals_the_generic_one(value: TransactionLogValue) -> None:
    """What this broker writes (known tags only) takes the unpack-only path, with the same value."""
    written = dataclasses.replace(
        value, unknown_tagged_fields=(), partitions=value.partitions and value.partitions[:3]
    )
    data = encode_value(written, 1)
    assert quick_value(data) == generic_decode_value(data) == written


@settings(max_examples=500)
@given(log_values(flexible=True), st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), max_size=3))
def test_quick_read_never_differs_from_the_generic_one(
    value: TransactionLogValue, edits: list[tuple[int, int]]
) -> None:
    """On any bytes, the quick path gives the generic reader's value or leaves them to it."""
    data = bytearray(encode_value(dataclasses.replace(value, unknown_tagged_fields=()), 1))
    for at, byte in edits:
        data[at % len(data)] = byte
    quick = quick_value(bytes(data))
    if quick is not None:
        assert quick == generic_decode_value(bytes(data))


@given(st.text(max_size=50))
def test_key_round_trip(tid: str) -> None:
    assert decode_key(encode_key(tid)) == tid


tps = st.builds(TopicPartition, topics, st.integers(0, 1000))


@st.composite
def transits(draw: st.DrawFn) -> TxnTransitMetadata:
    state = draw(st.sampled_from([s for s in S if s is not S.DEAD]))
    return TxnTransitMetadata(
        producer_id=ProducerId(draw(st.integers(0, 2**63 - 1))),
        prev_producer_id=ProducerId(draw(st.integers(-1, 2**40))),
        next_producer_id=ProducerId(-1),
        producer_epoch=ProducerEpoch(draw(st.integers(0, 2**15 - 1))),
        last_producer_epoch=ProducerEpoch(-1),
        txn_timeout_ms=draw(st.integers(1, 900_000)),
        state=state,
        partitions=frozenset() if state is S.EMPTY else draw(st.frozensets(tps, max_size=6)),
        txn_start_timestamp=draw(st.integers(-1, 2**45)),
        txn_last_update_timestamp=draw(st.integers(0, 2**45)),
    )


@given(transits(), st.sampled_from([0, 1]))
def test_transit_survives_the_log(transit: TxnTransitMetadata, version: int) -> None:
    loaded = transit_from_value(decode_value(encode_transit(transit, version)))
    expected = transit if version == 1 else _replace(transit, prev_producer_id=ProducerId(-1))
    assert loaded == expected


def test_last_epoch_and_fence_flag_are_not_persisted() -> None:
    transit = _replace(_transit(S.PREPARE_ABORT), last_producer_epoch=ProducerEpoch(4), epoch_fence=True)
    loaded = transit_from_value(decode_value(encode_transit(transit)))
    assert (loaded.last_producer_epoch, loaded.epoch_fence) == (-1, False)


def test_empty_value_partitions_are_ignored_on_read() -> None:
    value = TransactionLogValue(1, 0, 1, S.EMPTY.id, (("t", (1,)),), 0, -1)
    assert transit_from_value(decode_value(encode_value(value))).partitions == frozenset()


def test_dead_and_empty_with_partitions_are_not_values() -> None:
    with pytest.raises(ValueError, match="tombstone"):
        value_for_transit(_transit(S.DEAD))
    with pytest.raises(ValueError, match="Empty"):
        value_for_transit(_transit(S.EMPTY, partitions=frozenset({TopicPartition("t", 0)})))


def test_partitions_grouped_by_topic_and_sorted() -> None:
    parts = frozenset(TopicPartition(t, p) for t, p in [("b", 2), ("a", 1), ("b", 0)])
    assert value_for_transit(_transit(S.ONGOING, partitions=parts)).partitions == (("a", (1,)), ("b", (0, 2)))


# -- records, versions, corruption --------------------------------------------------------------


def test_read_record_value_and_tombstone() -> None:
    key = encode_key("x")
    rec = read_record(key, V1_BYTES)
    assert rec is not None and rec.transactional_id == "x" and rec.value == VALUE
    tomb = read_record(key, None)
    assert tomb is not None and tomb.value is None


def test_unknown_versions_are_skipped_by_read_record() -> None:
    assert read_record(b"\x00\x01\x00\x01x", V1_BYTES) is None  # another coordinator record type
    assert read_record(encode_key("x"), b"\x00\x02" + V1_BYTES[2:]) is None
    with pytest.raises(UnknownVersionError):
        decode_value(b"\x00\x02" + V1_BYTES[2:])
    with pytest.raises(UnknownVersionError):
        encode_value(VALUE, 2)


@pytest.mark.parametrize("data", [V0_BYTES, V1_BYTES])
def test_every_truncation_is_a_value_error(data: bytes) -> None:
    for cut in range(len(data)):
        with pytest.raises(ValueError):
            decode_value(data[:cut])
    with pytest.raises(ValueError, match="trailing"):
        decode_value(data + b"\x00")


@settings(max_examples=300)
@given(st.binary(max_size=80))
def test_garbage_never_crashes_with_other_errors(data: bytes) -> None:
    try:
        decode_value(data)
    except ValueError:
        pass


# -- helpers ------------------------------------------------------------------------------------


def _fields(v: TransactionLogValue) -> dict[str, object]:
    return {f.name: getattr(v, f.name) for f in dataclasses.fields(v)}


def _replace(t: TxnTransitMetadata, **kw: object) -> TxnTransitMetadata:
    return dataclasses.replace(t, **kw)  # type: ignore[arg-type]


def _transit(
    state: TransactionState, partitions: frozenset[TopicPartition] | None = None
) -> TxnTransitMetadata:
    return TxnTransitMetadata(
        producer_id=ProducerId(1),
        prev_producer_id=ProducerId(-1),
        next_producer_id=ProducerId(-1),
        producer_epoch=ProducerEpoch(0),
        last_producer_epoch=ProducerEpoch(-1),
        txn_timeout_ms=1000,
        state=state,
        partitions=frozenset({TopicPartition("t", 0)}) if partitions is None else partitions,
        txn_start_timestamp=-1 if state is S.EMPTY else 10,
        txn_last_update_timestamp=11,
    )
