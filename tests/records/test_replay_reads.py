"""The cheap reads a coordinator's load makes of every batch: ``record_key_values`` gives exactly
what ``decode_batch`` gives (offsets, keys, values; headers and timestamps skipped), and
``control_type`` exactly what ``read_control_marker`` gives, through its one-unpack path for the
markers the broker writes and through the full read for any other layout."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactly.protocol.primitives import WireFormatError
from exactly.records.batch import BatchHeader, iter_batches
from exactly.records.builder import (
    COMPRESSION_GZIP,
    Record,
    build_batch,
    decode_batch,
    payload_key_values,
    record_key_values,
)
from exactly.records.control import ControlType, build_control_batch, control_type, read_control_marker
from exactly.records.rebuild import build_retained_batch

records = st.lists(
    st.builds(
        Record,
        value=st.none() | st.binary(max_size=300),
        key=st.none() | st.binary(max_size=200),
        headers=st.lists(st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=5)), max_size=2).map(
            tuple
        ),
        timestamp=st.none() | st.integers(0, 2**40),
    ),
    min_size=1,
    max_size=8,
)


@given(records, st.sampled_from([0, COMPRESSION_GZIP]), st.integers(0, 2**40))
def test_record_key_values_is_decode_batch_without_records(
    batch_records: list[Record], compression: int, base_offset: int
) -> None:
    prefix = build_batch([Record(value=b"before")])  # headers are found at their position
    data = prefix + build_batch(batch_records, base_offset=base_offset, compression=compression)
    header = list(iter_batches(data))[1]
    _h, decoded = decode_batch(data, header.position)
    assert list(record_key_values(data, header)) == [(r.offset, r.key, r.value) for r in decoded]


def test_record_key_values_refuses_unknown_codecs() -> None:
    raw = bytearray(build_batch([Record(value=b"v")]))
    struct.pack_into(">h", raw, 21, 2)  # attributes: snappy (the CRC is not checked here)
    with pytest.raises(ValueError, match="compression codec 2"):
        list(record_key_values(bytes(raw), BatchHeader.parse(raw)))


@pytest.mark.parametrize("marker", list(ControlType))
def test_control_type_of_a_broker_marker(marker: ControlType) -> None:
    data = build_batch([Record(value=b"x")]) + build_control_batch(
        marker, producer_id=9, producer_epoch=2, coordinator_epoch=4, timestamp=1_700_000_000_000
    )
    header = list(iter_batches(data))[1]
    assert control_type(data, header) is marker is read_control_marker(data, header).type


@pytest.mark.parametrize("marker", list(ControlType))
def test_control_type_of_another_layout_takes_the_full_read(marker: ControlType) -> None:
    """A marker record with a timestamp delta (multi-byte varint) and a longer key: not the
    broker's layout, so the full read decides, with the same answer."""
    key = struct.pack(">hh", 0, int(marker)) + b"\x00\x00"
    record = Record(key=key, value=struct.pack(">hi", 0, 3), timestamp=5_000)
    data = build_batch([record], producer_id=9, transactional=True, control=True, base_timestamp=0)
    header = BatchHeader.parse(data)
    assert control_type(data, header) is marker is read_control_marker(data, header).type


@pytest.mark.parametrize("marker", list(ControlType))
@pytest.mark.parametrize("timestamp", [1_700_000_000_000, 0])
def test_control_type_of_a_marker_the_cleaner_gave_a_delete_horizon(
    marker: ControlType, timestamp: int
) -> None:
    """Rebuilt with a delete horizon as its base timestamp, the marker's record carries a
    multi-byte timestamp delta: the varint-skipping path reads it, with the full read's answer."""
    original = build_control_batch(
        marker, producer_id=9, producer_epoch=2, coordinator_epoch=4, timestamp=timestamp
    )
    header = BatchHeader.parse(original)
    _h, decoded = decode_batch(original, 0)
    data = build_batch([Record(value=b"x")]) + build_retained_batch(
        header, decoded, delete_horizon_ms=1_700_086_400_000
    )
    rebuilt = list(iter_batches(data))[1]
    assert control_type(data, rebuilt) is marker is read_control_marker(data, rebuilt).type


def test_control_type_of_an_unknown_type_raises_as_the_full_read_does() -> None:
    record = Record(key=struct.pack(">hh", 0, 7), value=struct.pack(">hi", 0, 3))
    data = build_batch([record], producer_id=9, transactional=True, control=True)
    header = BatchHeader.parse(data)
    with pytest.raises(ValueError):
        read_control_marker(data, header)
    with pytest.raises(ValueError):
        control_type(data, header)


@given(
    st.integers(1, 200),
    st.integers(0, 70),
    st.integers(0, 70),
    st.integers(0, 2**40),
)
def test_payload_key_values_reads_multi_byte_varints(
    count: int, key_size: int, value_size: int, timestamp: int
) -> None:
    """The load's walk reads an uncompressed batch's payload directly: one-byte varints inline,
    longer ones (a record length or key/value length from 64 bytes, offset deltas from 64, a
    timestamp delta) by the reader; same triples as ``decode_batch``."""
    batch = [
        Record(
            key=bytes([i % 251]) * key_size,
            value=bytes([i % 13]) * (value_size + i % 3),
            timestamp=timestamp + i,
        )
        for i in range(count)
    ]
    data = build_batch(batch, base_offset=1000, base_timestamp=timestamp)
    header = BatchHeader.parse(data)
    _h, decoded = decode_batch(data)
    expected = tuple((r.offset, r.key, r.value) for r in decoded)
    assert payload_key_values(memoryview(data)[61 : header.size], 1000, count) == expected
    assert record_key_values(data, header) == expected


def test_payload_key_values_of_a_truncated_payload_raises_wire_format_errors_only() -> None:
    """A payload cut anywhere gives either triples or WireFormatError (a ValueError, what the
    runtime's bad-record handling expects), never an IndexError from the inline varint reads."""
    data = build_batch([Record(key=b"k" * 70, value=b"v" * 5, timestamp=3_000), Record(key=None, value=b"w")])
    payload = data[61:]
    for cut in range(len(payload)):
        try:
            payload_key_values(memoryview(payload)[:cut], 0, 2)
        except WireFormatError:
            pass
