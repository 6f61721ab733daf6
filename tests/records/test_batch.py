"""Record batch v2 header view: parsing, validation as Kafka does it, in-place patching."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from exactly.records.batch import (
    BatchHeader,
    InvalidRecordError,
    increment_sequence,
    iter_batches,
    patch_base_offset,
    patch_partition_leader_epoch,
    validate_produce_records,
)
from exactly.records.builder import Record, build_batch, decode_batch
from exactly.records.control import ControlType, build_control_batch, read_control_marker


def _batch(n: int = 3, **kw: object) -> bytes:
    return build_batch([Record(value=f"v{i}".encode(), key=b"k") for i in range(n)], **kw)  # type: ignore[arg-type]


def test_header_fields_and_derived_values() -> None:
    raw = _batch(3, producer_id=7, producer_epoch=2, base_sequence=10, base_timestamp=1234)
    h = validate_produce_records(raw)
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (7, 2, 10)
    assert h.record_count == 3 and h.last_offset_delta == 2
    assert h.last_sequence == 12
    assert h.size == len(raw)
    assert h.base_timestamp == 1234 and not h.is_transactional and not h.is_control


def test_sequence_wraps_at_int32_max() -> None:
    assert increment_sequence(2**31 - 1, 1) == 0
    assert increment_sequence(2**31 - 2, 3) == 1
    h = BatchHeader.parse(_batch(3, producer_id=1, producer_epoch=0, base_sequence=2**31 - 2))
    assert h.last_sequence == 0


def test_crc_mismatch_is_corrupt_message() -> None:
    raw = bytearray(_batch())
    raw[-1] ^= 0xFF
    with pytest.raises(InvalidRecordError) as err:
        validate_produce_records(bytes(raw))
    assert err.value.error_code == ErrorCode.corrupt_message


def test_old_magic_is_refused() -> None:
    raw = bytearray(_batch())
    raw[16] = 1
    with pytest.raises(InvalidRecordError) as err:
        validate_produce_records(bytes(raw))
    assert err.value.error_code == ErrorCode.unsupported_for_message_format


def test_two_batches_in_one_partition_is_invalid_record() -> None:
    with pytest.raises(InvalidRecordError) as err:
        validate_produce_records(_batch() + _batch())
    assert err.value.error_code == ErrorCode.invalid_record


def test_truncated_batch_is_corrupt() -> None:
    raw = _batch()
    with pytest.raises(InvalidRecordError) as err:
        validate_produce_records(raw[:-5])
    assert err.value.error_code == ErrorCode.corrupt_message
    with pytest.raises(InvalidRecordError):
        validate_produce_records(raw[:20])
    with pytest.raises(InvalidRecordError):
        validate_produce_records(b"")


def test_clients_cannot_produce_control_batches() -> None:
    marker = build_control_batch(
        ControlType.COMMIT, producer_id=1, producer_epoch=0, coordinator_epoch=0, timestamp=1
    )
    with pytest.raises(InvalidRecordError) as err:
        validate_produce_records(marker)
    assert err.value.error_code == ErrorCode.invalid_record


def test_patching_offsets_keeps_crc_valid() -> None:
    raw = bytearray(_batch())
    patch_base_offset(raw, 0, 123456)
    patch_partition_leader_epoch(raw, 0, 9)
    h = validate_produce_records(bytes(raw))
    assert h.base_offset == 123456 and h.partition_leader_epoch == 9
    _h, records = decode_batch(bytes(raw))
    assert [r.offset for r in records] == [123456, 123457, 123458]


def test_iter_batches_stops_at_torn_tail() -> None:
    a, b = _batch(2), _batch(5)
    buf = a + b + b[:40]
    headers = list(iter_batches(buf, verify_crc=True))
    assert [h.position for h in headers] == [0, len(a)]
    corrupt = bytearray(a + b)
    corrupt[len(a) + 70] ^= 1
    assert len(list(iter_batches(bytes(corrupt), verify_crc=True))) == 1


def test_control_marker_round_trip() -> None:
    raw = build_control_batch(
        ControlType.ABORT, producer_id=5, producer_epoch=3, coordinator_epoch=8, timestamp=99
    )
    h = BatchHeader.parse(raw)
    assert h.is_control and h.is_transactional and h.base_sequence == -1
    marker = read_control_marker(raw, h)
    assert marker.type is ControlType.ABORT and marker.coordinator_epoch == 8


def test_decode_round_trip_with_headers_and_nulls() -> None:
    recs = [
        Record(value=None, key=b"a", headers=(("h1", b"x"), ("h2", None))),
        Record(value=b"v", timestamp=50),
    ]
    raw = build_batch(recs, base_timestamp=40)
    _h, out = decode_batch(raw)
    assert out[0].value is None and out[0].key == b"a" and out[0].headers == (("h1", b"x"), ("h2", None))
    assert out[1].value == b"v" and out[1].timestamp == 50 and out[0].timestamp == 40
