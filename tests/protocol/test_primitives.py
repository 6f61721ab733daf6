"""Kafka's primitive encodings: round trips, Kafka's byte layouts and its overflow limits."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactly.coordinator.group.records import RecordDecodeError, decode_offset_commit_value
from exactly.coordinator.txn.log import decode_value
from exactly.protocol.primitives import (
    Reader,
    WireFormatError,
    Writer,
    append_uvarint,
    append_varint,
    append_varlong,
    read_uvarint,
    read_varint,
    read_varlong,
    skip_tagged_fields,
    write_uvarint,
)
from exactly.records.batch import HEADER_SIZE, BatchHeader
from exactly.records.builder import Record, build_batch, decode_batch
from exactly.records.control import ControlType, build_control_batch, read_control_marker

UINT32 = st.integers(0, 2**32 - 1)
INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)


def _uvarint(value: int) -> bytes:
    out = bytearray()
    append_uvarint(value, out)
    return bytes(out)


def _varint(value: int) -> bytes:
    out = bytearray()
    append_varint(value, out)
    return bytes(out)


def _varlong(value: int) -> bytes:
    out = bytearray()
    append_varlong(value, out)
    return bytes(out)


# ---- round trips -----------------------------------------------------------------------------


@given(UINT32, st.binary(max_size=4))
def test_uvarint_round_trips_and_stops_at_its_end(value: int, tail: bytes) -> None:
    raw = _uvarint(value)
    assert raw == write_uvarint(value)
    assert 1 <= len(raw) <= 5
    assert read_uvarint(raw + tail, 0) == (value, len(raw))
    assert read_uvarint(b"\x00" + raw, 1) == (value, len(raw) + 1)


@given(INT32)
def test_varint_round_trips(value: int) -> None:
    raw = _varint(value)
    assert len(raw) <= 5
    assert read_varint(raw, 0) == (value, len(raw))
    assert read_varlong(raw, 0) == (value, len(raw))  # an int32 varint is a valid varlong


@given(INT64)
def test_varlong_round_trips(value: int) -> None:
    raw = _varlong(value)
    assert len(raw) <= 10
    assert read_varlong(raw, 0) == (value, len(raw))


@given(UINT32)
def test_every_strict_prefix_of_a_uvarint_is_truncated(value: int) -> None:
    raw = _uvarint(value)
    for cut in range(len(raw)):
        with pytest.raises(WireFormatError):
            read_uvarint(raw[:cut], 0)


def test_kafka_byte_layouts() -> None:
    # ByteUtils: 7-bit groups, least significant first; zig-zag maps 0,-1,1,-2 to 0,1,2,3
    assert _uvarint(0) == b"\x00"
    assert _uvarint(300) == b"\xac\x02"
    assert _uvarint(2**32 - 1) == b"\xff\xff\xff\xff\x0f"
    assert [_varint(v) for v in (0, -1, 1, -2, 63, -64, 64)] == [
        b"\x00",
        b"\x01",
        b"\x02",
        b"\x03",
        b"\x7e",
        b"\x7f",
        b"\x80\x01",
    ]
    assert _varint(-(2**31)) == b"\xff\xff\xff\xff\x0f"
    assert _varlong(-(2**63)) == b"\xff" * 9 + b"\x01"


def test_writers_refuse_values_outside_their_type() -> None:
    for bad in (-1, 2**32):
        with pytest.raises(ValueError):
            _uvarint(bad)
    for bad in (-(2**31) - 1, 2**31):
        with pytest.raises(ValueError):
            _varint(bad)
    for bad in (-(2**63) - 1, 2**63):
        with pytest.raises(ValueError):
            _varlong(bad)


# ---- Kafka's overflow limits -----------------------------------------------------------------


@pytest.mark.parametrize("reader", [read_uvarint, read_varint])
def test_a_six_byte_varint_is_refused(reader: object) -> None:
    assert callable(reader)
    five = b"\xff\xff\xff\xff\x0f"
    assert reader(five, 0)[1] == 5
    for six in (b"\x80" * 5 + b"\x00", b"\xff" * 5 + b"\x01"):
        with pytest.raises(WireFormatError, match="longer than 5 bytes"):
            reader(six, 0)


def test_an_eleven_byte_varlong_is_refused() -> None:
    assert read_varlong(b"\x80" * 9 + b"\x00", 0) == (0, 10)
    with pytest.raises(WireFormatError, match="longer than 10 bytes"):
        read_varlong(b"\x80" * 10 + b"\x00", 0)


@given(st.integers(6, 12))
def test_overlong_uvarints_are_refused_whatever_their_length(n: int) -> None:
    with pytest.raises(WireFormatError):
        read_uvarint(b"\x80" * (n - 1) + b"\x00", 0)


def test_every_codec_applies_the_same_limit() -> None:
    six = b"\x80" * 5 + b"\x00"  # a zero, encoded in six bytes
    # a compact-string length in a flexible request header's tagged fields
    with pytest.raises(WireFormatError):
        skip_tagged_fields(six, 0)
    # a record's length in a v2 batch
    batch = bytearray(build_batch([Record(value=b"v")]))
    body = bytes(batch[HEADER_SIZE:])
    patched = bytes(batch[:HEADER_SIZE]) + six + body[1:]
    with pytest.raises(WireFormatError):
        decode_batch(patched)
    # a control record's length
    marker = bytearray(
        build_control_batch(
            ControlType.COMMIT, producer_id=1, producer_epoch=0, coordinator_epoch=0, timestamp=0
        )
    )
    marker_header = BatchHeader.parse(bytes(marker), 0)
    marker[HEADER_SIZE : HEADER_SIZE + 1] = six
    with pytest.raises(WireFormatError):
        read_control_marker(bytes(marker), marker_header)
    # a compact string length in a flexible __consumer_offsets value (v4)
    with pytest.raises(RecordDecodeError):
        decode_offset_commit_value(struct.pack(">hqi", 4, 0, -1) + six)
    # a compact array length in a flexible __transaction_state value (v1)
    with pytest.raises(ValueError):
        decode_value(struct.pack(">hqhib", 1, 1, 0, 1000, 0) + six)


# ---- the cursor ------------------------------------------------------------------------------


@given(st.binary(max_size=24), st.booleans())
def test_reader_raises_only_wire_format_errors(data: bytes, compact: bool) -> None:
    reads = [
        lambda r: r.int8(),
        lambda r: r.int16(),
        lambda r: r.int32(),
        lambda r: r.int64(),
        lambda r: r.uvarint(),
        lambda r: r.varint(),
        lambda r: r.varlong(),
        lambda r: r.nullable_string(compact),
        lambda r: r.nullable_bytes(compact),
        lambda r: r.array_length(compact),
        lambda r: r.tagged_fields(),
    ]
    for read in reads:
        r = Reader(data)
        while True:
            try:
                read(r)
            except WireFormatError:
                break
            if r.done():
                break


@given(
    st.one_of(st.none(), st.text(max_size=40)),
    st.one_of(st.none(), st.binary(max_size=40)),
    st.lists(st.tuples(st.integers(0, 1000), st.binary(max_size=8)), max_size=4, unique_by=lambda t: t[0]),
    st.booleans(),
    INT64,
)
def test_writer_and_reader_agree(
    text: str | None, blob: bytes | None, tags: list[tuple[int, bytes]], compact: bool, number: int
) -> None:
    w = Writer()
    w.string(text, compact)
    w.bytes_(blob, compact)
    w.int64(number)
    w.varlong(number)
    w.tagged_fields(tags)
    r = Reader(bytes(w.out))
    assert r.nullable_string(compact) == text
    assert r.nullable_bytes(compact) == blob
    assert r.int64() == number
    assert r.varlong() == number
    assert r.tagged_fields() == dict(tags)
    assert r.done()


def test_reader_refuses_what_cannot_fit() -> None:
    with pytest.raises(WireFormatError, match="array of"):
        Reader(b"\x00\x00\x01\x00xyz").array_length(compact=False)
    with pytest.raises(WireFormatError, match="null string"):
        Reader(b"\x00").string(compact=True)
    with pytest.raises(WireFormatError, match="UTF-8"):
        Reader(b"\x02\xff").string(compact=True)
    with pytest.raises(WireFormatError, match="duplicate"):
        Reader(b"\x02\x01\x00\x01\x00").tagged_fields()
