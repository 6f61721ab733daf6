"""``__consumer_offsets`` codecs: Kafka's exact bytes, every version, tombstones, partition_for."""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactly.coordinator.group.records import (
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadata,
    OffsetCommitKey,
    OffsetCommitValue,
    RecordDecodeError,
    _decode_key,
    _decode_offset_commit_value,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
    decode_record,
    encode_group_metadata_value,
    encode_key,
    encode_offset_commit_value,
    encode_record,
    java_string_hash,
    kafka_abs,
    partition_for,
)

text = st.text(max_size=30)
i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)


# -- exact bytes -------------------------------------------------------------------------------


def test_offset_commit_key_bytes() -> None:
    assert (
        encode_key(OffsetCommitKey("g", "t", 3))
        == b"\x00\x01" + b"\x00\x01g" + b"\x00\x01t" + b"\x00\x00\x00\x03"
    )


def test_legacy_key_version_0_decodes_as_offset_commit() -> None:
    assert decode_key(b"\x00\x00\x00\x01g\x00\x01t\x00\x00\x00\x07") == OffsetCommitKey("g", "t", 7)


def test_group_metadata_key_bytes() -> None:
    assert encode_key(GroupMetadataKey("grp")) == b"\x00\x02\x00\x03grp"


def test_unknown_record_types_are_not_ours() -> None:
    assert decode_key(b"\x00\x03\x00\x01g") is None  # ConsumerGroupMetadataKey (KIP-848)
    assert decode_record(b"\x00\x05\x00\x01g", b"\x00\x00") is None


def test_offset_commit_value_v3_bytes() -> None:
    value = OffsetCommitValue(offset=42, metadata="m", commit_timestamp=1000, leader_epoch=5)
    expected = struct.pack(">hqih1sq", 3, 42, 5, 1, b"m", 1000)
    assert encode_offset_commit_value(value) == expected


def test_offset_commit_value_with_expiry_is_v1() -> None:
    value = OffsetCommitValue(offset=1, metadata="", commit_timestamp=10, expire_timestamp=99)
    assert encode_offset_commit_value(value) == struct.pack(">hqhqq", 1, 1, 0, 10, 99)


def test_offset_commit_value_v4_is_flexible() -> None:
    value = OffsetCommitValue(offset=7, metadata="ab", commit_timestamp=3, leader_epoch=-1)
    encoded = encode_offset_commit_value(value, 4)
    assert encoded == struct.pack(">hqi", 4, 7, -1) + b"\x03ab" + struct.pack(">q", 3) + b"\x00"
    assert decode_offset_commit_value(encoded) == value


def test_group_metadata_value_v3_bytes() -> None:
    value = GroupMetadataValue(
        protocol_type="consumer",
        generation=2,
        protocol="range",
        leader="m1",
        current_state_timestamp=77,
        members=(
            MemberMetadata(
                member_id="m1",
                group_instance_id=None,
                client_id="c",
                client_host="/h",
                rebalance_timeout=300,
                session_timeout=100,
                subscription=b"S",
                assignment=b"AA",
            ),
        ),
    )
    expected = (
        b"\x00\x03"
        + b"\x00\x08consumer"
        + b"\x00\x00\x00\x02"
        + b"\x00\x05range"
        + b"\x00\x02m1"
        + struct.pack(">q", 77)
        + b"\x00\x00\x00\x01"
        + b"\x00\x02m1"
        + b"\xff\xff"  # null group instance id
        + b"\x00\x01c"
        + b"\x00\x02/h"
        + struct.pack(">ii", 300, 100)
        + b"\x00\x00\x00\x01S"
        + b"\x00\x00\x00\x02AA"
    )
    assert encode_group_metadata_value(value) == expected
    assert decode_group_metadata_value(expected) == value


def test_empty_group_value_has_null_protocol_and_leader() -> None:
    value = GroupMetadataValue(protocol_type="", generation=0)
    encoded = encode_group_metadata_value(value)
    assert (
        encoded
        == b"\x00\x03\x00\x00"
        + b"\x00\x00\x00\x00"
        + b"\xff\xff\xff\xff"
        + struct.pack(">q", -1)
        + b"\x00\x00\x00\x00"
    )


def test_v0_group_value_defaults_rebalance_timeout() -> None:
    value = GroupMetadataValue(
        protocol_type="consumer",
        generation=1,
        protocol="range",
        leader="m",
        members=(MemberMetadata(member_id="m", client_id="c", client_host="h", session_timeout=9),),
    )
    decoded = decode_group_metadata_value(encode_group_metadata_value(value, 0))
    assert decoded.members[0].rebalance_timeout == -1
    assert decoded.current_state_timestamp == -1


def test_tombstones() -> None:
    assert encode_record(OffsetCommitKey("g", "t", 0), None) == (
        encode_key(OffsetCommitKey("g", "t", 0)),
        None,
    )
    assert decode_record(encode_key(GroupMetadataKey("g")), None) == (GroupMetadataKey("g"), None)


@pytest.mark.parametrize("data", [b"", b"\x00", b"\x00\x03\x00", b"\x00\x09" + b"\x00" * 20])
def test_truncated_or_unknown_values_raise(data: bytes) -> None:
    with pytest.raises(RecordDecodeError):
        decode_offset_commit_value(data)


def test_truncated_group_value_raises() -> None:
    encoded = encode_group_metadata_value(GroupMetadataValue(protocol_type="consumer", generation=1))
    with pytest.raises(RecordDecodeError):
        decode_group_metadata_value(encoded[:-2])


# -- partition_for -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("a", 97),
        ("hello", 99162322),
        ("\U0001f600", 31 * 0xD83D + 0xDE00),
        ("polygenelubricants", -(2**31)),
    ],
)
def test_java_string_hash(text: str, expected: int) -> None:
    assert java_string_hash(text) == expected


def test_abs_of_int_min_is_zero() -> None:
    assert kafka_abs(-(2**31)) == 0
    assert partition_for("polygenelubricants") == 0  # Math.abs would give a negative partition
    assert partition_for("hello") == 99162322 % 50
    assert partition_for("hello", 7) == 99162322 % 7


@given(st.text(max_size=40), st.integers(1, 200))
def test_partition_in_range(group: str, n: int) -> None:
    assert 0 <= partition_for(group, n) < n


# -- round trips -------------------------------------------------------------------------------

offset_values = st.builds(
    OffsetCommitValue,
    offset=i64,
    metadata=text,
    commit_timestamp=i64,
    leader_epoch=i32,
    expire_timestamp=i64,
)


@given(offset_values, st.integers(0, 4))
def test_offset_value_round_trip_every_version(value: OffsetCommitValue, version: int) -> None:
    decoded = decode_offset_commit_value(encode_offset_commit_value(value, version))
    assert decoded.offset == value.offset
    assert decoded.metadata == value.metadata
    assert decoded.commit_timestamp == value.commit_timestamp
    assert decoded.leader_epoch == (value.leader_epoch if version >= 3 else -1)
    assert decoded.expire_timestamp == (value.expire_timestamp if version == 1 else -1)


members = st.builds(
    MemberMetadata,
    member_id=text,
    group_instance_id=st.none() | text,
    client_id=text,
    client_host=text,
    rebalance_timeout=i32,
    session_timeout=i32,
    subscription=st.binary(max_size=40),
    assignment=st.binary(max_size=40),
)
group_values = st.builds(
    GroupMetadataValue,
    protocol_type=text,
    generation=i32,
    protocol=st.none() | text,
    leader=st.none() | text,
    current_state_timestamp=i64,
    members=st.lists(members, max_size=4).map(tuple),
)


@given(group_values)
def test_group_value_round_trip_v3_and_v4(value: GroupMetadataValue) -> None:
    assert decode_group_metadata_value(encode_group_metadata_value(value)) == value
    assert decode_group_metadata_value(encode_group_metadata_value(value, 4)) == value


@given(text, text, i32)
def test_key_round_trip(group: str, topic: str, partition: int) -> None:
    assert decode_key(encode_key(OffsetCommitKey(group, topic, partition))) == OffsetCommitKey(
        group, topic, partition
    )
    assert decode_key(encode_key(GroupMetadataKey(group))) == GroupMetadataKey(group)


@given(st.binary(max_size=64))
def test_decoders_never_crash_unexpectedly(data: bytes) -> None:
    for decode in (decode_offset_commit_value, decode_group_metadata_value):
        try:
            decode(data)
        except RecordDecodeError:
            pass


# -- the struct-only fast paths give exactly what the generic reader gives ------------------------


def _outcome(decode: Callable[[bytes], object], data: bytes) -> object:
    try:
        return decode(data)
    except RecordDecodeError:
        return RecordDecodeError


@given(offset_values, st.integers(0, 4), st.integers(0, 40), st.binary(max_size=3))
def test_fast_value_decoding_matches_the_generic_reader(
    value: OffsetCommitValue, version: int, cut: int, tail: bytes
) -> None:
    """Whole, truncated and padded encodings of every version, and a null metadata string."""
    whole = encode_offset_commit_value(value, version)
    null_metadata = whole.replace(
        struct.pack(">h", len(value.metadata.encode())) + value.metadata.encode(), b"\xff\xff", 1
    )
    for data in (whole, whole[:cut], whole + tail, null_metadata):
        assert _outcome(decode_offset_commit_value, data) == _outcome(_decode_offset_commit_value, data)


@given(text, text, i32, st.integers(0, 30), st.binary(max_size=3), st.integers(0, 1))
def test_fast_key_decoding_matches_the_generic_reader(
    group: str, topic: str, partition: int, cut: int, tail: bytes, version: int
) -> None:
    whole = struct.pack(">h", version) + encode_key(OffsetCommitKey(group, topic, partition))[2:]
    for data in (whole, whole[:cut], whole + tail):
        assert _outcome(decode_key, data) == _outcome(_decode_key, data)


@given(st.binary(max_size=64))
def test_fast_decoding_matches_the_generic_reader_on_any_bytes(data: bytes) -> None:
    for fast, generic in (
        (decode_key, _decode_key),
        (decode_offset_commit_value, _decode_offset_commit_value),
    ):
        for candidate in (data, b"\x00\x01" + data, b"\x00\x03" + data):
            assert _outcome(fast, candidate) == _outcome(generic, candidate)


def test_invalid_utf8_and_negative_lengths_fall_back_to_the_generic_errors() -> None:
    bad_group = b"\x00\x01\x00\x02\xff\xfe\x00\x02in\x00\x00\x00\x00"
    negative_topic = b"\x00\x01\x00\x01g\xff\xfe\x00\x00\x00\x00"
    bad_metadata = b"\x00\x03" + struct.pack(">qih", 5, 0, 2) + b"\xff\xfe" + struct.pack(">q", 1)
    for decode, data in (
        (decode_key, bad_group),
        (decode_key, negative_topic),
        (decode_offset_commit_value, bad_metadata),
    ):
        with pytest.raises(RecordDecodeError):
            decode(data)
