"""Rebuilt batches (what the log cleaner writes): offsets, producer fields, CRC, delete horizon."""

from __future__ import annotations

from exactly.records.batch import (
    DELETE_HORIZON_FLAG,
    TIMESTAMP_TYPE_MASK,
    BatchHeader,
    compute_crc,
    iter_batches,
)
from exactly.records.builder import COMPRESSION_GZIP, TICK_EVERY, Record, build_batch, decode_batch
from exactly.records.rebuild import (
    build_empty_batch,
    build_retained_batch,
    delete_horizon_of,
    record_key_states,
)

T0 = 1_700_000_000_000


def original(compression: int = 0) -> bytes:
    records = [Record(key=b"k%d" % i, value=b"v%d" % i, timestamp=T0 + i) for i in range(5)]
    batch = bytearray(
        build_batch(
            records,
            base_offset=100,
            producer_id=7,
            producer_epoch=3,
            base_sequence=40,
            transactional=True,
            base_timestamp=T0,
            partition_leader_epoch=9,
            compression=compression,
        )
    )
    return bytes(batch)


def test_retained_batch_keeps_offsets_producer_fields_and_last_offset() -> None:
    for compression in (0, COMPRESSION_GZIP):
        data = original(compression)
        header, records = decode_batch(data)
        kept = [records[1], records[3]]
        rebuilt = build_retained_batch(header, kept, delete_horizon_ms=None)
        new = BatchHeader.parse(rebuilt)
        assert compute_crc(rebuilt, 0, len(rebuilt)) == new.crc
        assert list(iter_batches(rebuilt, verify_crc=True)) == [new]
        assert (new.base_offset, new.last_offset, new.record_count) == (100, 104, 2)
        assert (new.producer_id, new.producer_epoch, new.base_sequence, new.partition_leader_epoch) == (
            7,
            3,
            40,
            9,
        )
        assert new.last_sequence == 44  # the producer's last sequence survives its record
        assert new.is_transactional and new.compression == compression
        _h, decoded = decode_batch(rebuilt)
        assert [(r.offset, r.key, r.value, r.timestamp) for r in decoded] == [
            (r.offset, r.key, r.value, r.timestamp) for r in kept
        ]
        assert delete_horizon_of(new) is None


def test_delete_horizon_is_the_base_timestamp_and_record_timestamps_survive() -> None:
    header, records = decode_batch(original())
    horizon = T0 + 86_400_000
    rebuilt = build_retained_batch(header, records[2:], delete_horizon_ms=horizon)
    new = BatchHeader.parse(rebuilt)
    assert new.attributes & DELETE_HORIZON_FLAG and delete_horizon_of(new) == horizon
    assert new.base_timestamp == horizon and new.max_timestamp == T0 + 4
    _h, decoded = decode_batch(rebuilt)
    assert [r.timestamp for r in decoded] == [T0 + 2, T0 + 3, T0 + 4]


def test_log_append_time_batch_keeps_its_max_timestamp() -> None:
    data = bytearray(original())
    from exactly.records.batch import stamp_log_append_time

    header = stamp_log_append_time(data, BatchHeader.parse(data), T0 + 999)
    _h, records = decode_batch(bytes(data))
    new = BatchHeader.parse(build_retained_batch(header, records[:1], delete_horizon_ms=None))
    assert new.attributes & TIMESTAMP_TYPE_MASK and new.max_timestamp == T0 + 999


def test_empty_batch_is_a_header_with_the_last_offset() -> None:
    header = BatchHeader.parse(original(COMPRESSION_GZIP))
    empty = build_empty_batch(header)
    new = BatchHeader.parse(empty)
    assert len(empty) == 61 and new.record_count == 0 and new.compression == 0
    assert (new.base_offset, new.last_offset, new.base_sequence, new.producer_epoch) == (100, 104, 40, 3)
    assert new.base_timestamp == new.max_timestamp == header.max_timestamp
    assert list(iter_batches(empty, verify_crc=True)) == [new]
    assert decode_batch(empty)[1] == []


def test_record_keys_reads_offsets_and_keys_only() -> None:
    from exactly.records.rebuild import record_keys

    for compression in (0, COMPRESSION_GZIP):
        data = original(compression)
        header, records = decode_batch(data)
        assert list(record_keys(data, header)) == [(r.offset, r.key) for r in records]
    header, records = decode_batch(original())
    rebuilt = build_retained_batch(header, [records[4]], delete_horizon_ms=None)
    assert list(record_keys(rebuilt, BatchHeader.parse(rebuilt))) == [(104, b"k4")]


def test_record_key_states_tell_tombstones_and_keyless_records_without_decoding_values() -> None:
    records = [
        Record(key=b"a", value=b"x" * 300, headers=(("h", b"1"),), timestamp=T0),
        Record(key=b"b", value=None, timestamp=T0 + 1),  # tombstone
        Record(key=None, value=b"keyless", timestamp=T0 + 2),
        Record(key=b"", value=b"", timestamp=T0 + 3),  # empty key and value: neither null
        Record(key=b"c" * 200, value=None, headers=(("h", None),), timestamp=T0 + 4),
    ]
    for compression in (0, COMPRESSION_GZIP):
        data = build_batch(records, base_offset=50, base_timestamp=T0, compression=compression)
        header, decoded = decode_batch(data)
        assert list(record_key_states(data, header)) == [(r.offset, r.key, r.value is None) for r in decoded]
        assert [t for _o, _k, t in record_key_states(data, header)] == [False, True, False, False, True]


def test_ticked_decode_and_rebuild_give_the_same_records_and_bytes() -> None:
    """The cleaner's worker passes a ``tick`` (its CPU duty cycle) into decoding and re-encoding
    a partly kept batch, called every TICK_EVERY records; it changes nothing decoded or built."""
    records = [Record(key=b"k%d" % (i % 70), value=b"v" * (i % 13)) for i in range(1000)]
    buf = build_batch(records, base_offset=5000, base_timestamp=1_700_000_000_000)
    ticks: list[int] = []
    header, plain = decode_batch(buf)
    assert decode_batch(buf, tick=lambda: ticks.append(1)) == (header, plain)
    assert len(ticks) == 1000 // TICK_EVERY
    kept = plain[::3]
    ticks.clear()
    rebuilt = build_retained_batch(header, kept, delete_horizon_ms=None, tick=lambda: ticks.append(1))
    assert rebuilt == build_retained_batch(header, kept, delete_horizon_ms=None)
    assert len(ticks) == len(kept) // TICK_EVERY
    assert decode_batch(rebuilt)[1] == kept
