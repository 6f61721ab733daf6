"""Byte-exact key/value codecs for the group records of ``__consumer_offsets``.

Kafka stores two record kinds for classic groups, each as ``int16 version`` followed by the fields of
the message at that version (the generated ``*Key``/``*Value`` JSON specs of the group-coordinator
module):

- key version 0 or 1 -> ``OffsetCommitKey`` (group, topic, partition); 1 is what Kafka writes.
- key version 2      -> ``GroupMetadataKey`` (group).
- ``OffsetCommitValue`` v0..v4: offset, leaderEpoch (v3+), metadata, commitTimestamp,
  expireTimestamp (v1 only). Kafka writes v3, or v1 when the commit carries a retention time.
  v4 is the first flexible version (compact strings + tagged fields).
- ``GroupMetadataValue`` v0..v4: protocolType, generation, protocol?, leader?,
  currentStateTimestamp (v2+), members[memberId, groupInstanceId? (v3+), clientId, clientHost,
  rebalanceTimeout (v1+), sessionTimeout, subscription, assignment]. Kafka writes v3; v4 is flexible.

A null value is a tombstone: it deletes the committed offset or the group. Decoders accept every
version (other tools or an older Kafka may have written the log); encoders default to the versions
Kafka itself writes so that Kafka's own tools can read our log. Unknown tagged fields are skipped.

``partition_for`` maps a group id to its ``__consumer_offsets`` partition exactly as Kafka does:
``Utils.abs(groupId.hashCode()) % n`` where ``hashCode`` is Java's over UTF-16 code units and
``Utils.abs(Integer.MIN_VALUE) == 0`` (unlike ``Math.abs``).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from exactly.frozen import quick_init
from exactly.protocol.primitives import Reader, WireFormatError, write_uvarint

OFFSET_COMMIT_KEY_VERSION = 1
GROUP_METADATA_KEY_VERSION = 2
OFFSET_COMMIT_VALUE_VERSION = 3
OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY = 1
GROUP_METADATA_VALUE_VERSION = 3
DEFAULT_NUM_PARTITIONS = 50

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_I16_I16 = struct.Struct(">hh")
_I64_I64 = struct.Struct(">qq")
_VALUE_HEAD = struct.Struct(">hqi")  # version, offset, then v3's leader epoch (v1: metadata length + 2 bytes)
_T = TypeVar("_T")


class RecordDecodeError(ValueError):
    """The bytes are not a record of a known type/version (or are truncated)."""


# ---------------------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------------------


@quick_init
@dataclass(frozen=True, slots=True)
class OffsetCommitKey:
    group: str
    topic: str
    partition: int


@quick_init
@dataclass(frozen=True, slots=True)
class GroupMetadataKey:
    group: str


RecordKey = OffsetCommitKey | GroupMetadataKey


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommitValue:
    offset: int
    metadata: str = ""
    commit_timestamp: int = -1
    leader_epoch: int = -1
    expire_timestamp: int = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberMetadata:
    member_id: str
    group_instance_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    rebalance_timeout: int = -1
    session_timeout: int = 0
    subscription: bytes = b""
    assignment: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupMetadataValue:
    protocol_type: str
    generation: int
    protocol: str | None = None
    leader: str | None = None
    current_state_timestamp: int = -1
    members: tuple[MemberMetadata, ...] = field(default=())


# ---------------------------------------------------------------------------------------------
# partition_for
# ---------------------------------------------------------------------------------------------


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode``: ``h = 31*h + c`` over UTF-16 code units, as a signed int32."""
    h = 0
    encoded = text.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(encoded), 2):
        h = (31 * h + ((encoded[i] << 8) | encoded[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def kafka_abs(n: int) -> int:
    """Kafka ``Utils.abs``: like abs, but ``Integer.MIN_VALUE`` maps to 0, not to itself."""
    return 0 if n == -(2**31) else abs(n)


@functools.lru_cache(maxsize=4096)  # every group request asks; the hash walks the id in Python
def partition_for(group_id: str, num_partitions: int = DEFAULT_NUM_PARTITIONS) -> int:
    """The ``__consumer_offsets`` partition that owns ``group_id`` (Kafka's mapping)."""
    return kafka_abs(java_string_hash(group_id)) % num_partitions


# ---------------------------------------------------------------------------------------------
# Primitive writers/readers
# ---------------------------------------------------------------------------------------------


def _string(value: str | None, flexible: bool) -> bytes:
    if value is None:
        return b"\x00" if flexible else _I16.pack(-1)
    raw = value.encode("utf-8")
    return (write_uvarint(len(raw) + 1) if flexible else _I16.pack(len(raw))) + raw


def _bytes(value: bytes, flexible: bool) -> bytes:
    return (write_uvarint(len(value) + 1) if flexible else _I32.pack(len(value))) + value


def _decoder(decode: Callable[[bytes], _T]) -> Callable[[bytes], _T]:
    """The decoders raise RecordDecodeError only: a failure of the primitive reader (truncation,
    an overlong varint, bad UTF-8) becomes one."""

    @functools.wraps(decode)
    def checked(data: bytes) -> _T:
        try:
            return decode(data)
        except WireFormatError as exc:
            raise RecordDecodeError(str(exc)) from exc

    return checked


# ---------------------------------------------------------------------------------------------
# Keys
# ---------------------------------------------------------------------------------------------


def encode_key(key: RecordKey) -> bytes:
    """Encode a key at the version Kafka writes (1 for offsets, 2 for group metadata)."""
    if isinstance(key, OffsetCommitKey):
        return (
            _I16.pack(OFFSET_COMMIT_KEY_VERSION)
            + _string(key.group, False)
            + _string(key.topic, False)
            + _I32.pack(key.partition)
        )
    return _I16.pack(GROUP_METADATA_KEY_VERSION) + _string(key.group, False)


def decode_key(data: bytes) -> RecordKey | None:
    """Decode a key; None for record types this coordinator does not own (e.g. KIP-848 ones).

    Offset-commit keys, nearly every record a load replays, take a struct-only path; anything it
    does not accept as well formed goes through the generic reader, which gives the same key or
    raises the same RecordDecodeError."""
    fast = _offset_commit_key(data)
    return fast if fast is not None else _decode_key(data)


def _offset_commit_key(data: bytes) -> OffsetCommitKey | None:
    """A well-formed v0/v1 offset-commit key with struct unpacks only, else None."""
    size = len(data)
    if size < 8:
        return None
    version, group_len = _I16_I16.unpack_from(data)
    topic_at = 4 + group_len
    if version not in (0, 1) or group_len < 0 or topic_at + 2 > size:
        return None
    topic_len = _I16.unpack_from(data, topic_at)[0]
    partition_at = topic_at + 2 + topic_len
    if topic_len < 0 or partition_at + 4 > size:
        return None
    try:
        group = str(data[4:topic_at], "utf-8")
        topic = str(data[topic_at + 2 : partition_at], "utf-8")
    except UnicodeDecodeError:
        return None
    return OffsetCommitKey(group, topic, _I32.unpack_from(data, partition_at)[0])


@_decoder
def _decode_key(data: bytes) -> RecordKey | None:
    r = Reader(data)
    version = r.int16()
    if version in (0, 1):
        return OffsetCommitKey(r.string(False), r.string(False), r.int32())
    if version == 2:
        return GroupMetadataKey(r.string(False))
    return None


# ---------------------------------------------------------------------------------------------
# OffsetCommitValue
# ---------------------------------------------------------------------------------------------


def offset_commit_value_version(value: OffsetCommitValue) -> int:
    """The version Kafka would write: 1 when an expiry is set, else 3."""
    return (
        OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY
        if value.expire_timestamp >= 0
        else OFFSET_COMMIT_VALUE_VERSION
    )


def encode_offset_commit_value(value: OffsetCommitValue, version: int | None = None) -> bytes:
    """Encode at ``version`` (default: what Kafka writes). Fields absent in a version are dropped."""
    v = offset_commit_value_version(value) if version is None else version
    if not 0 <= v <= 4:
        raise ValueError(f"OffsetCommitValue version {v} not supported")
    flexible = v >= 4
    out = [_I16.pack(v), _I64.pack(value.offset)]
    if v >= 3:
        out.append(_I32.pack(value.leader_epoch))
    out.append(_string(value.metadata, flexible))
    out.append(_I64.pack(value.commit_timestamp))
    if v == 1:
        out.append(_I64.pack(value.expire_timestamp))
    if flexible:
        out.append(b"\x00")
    return b"".join(out)


def decode_offset_commit_value(data: bytes) -> OffsetCommitValue:
    """Decode any version; v3 and v1 (what Kafka writes) take a struct-only path when well formed,
    everything else the generic reader (same value, or the same RecordDecodeError)."""
    size = len(data)
    if size >= 16:
        version, offset, word = _VALUE_HEAD.unpack_from(data)
        if version == 3:
            meta_len = _I16.unpack_from(data, 14)[0]
            end = 16 + max(meta_len, 0)
            if end + 8 <= size:
                try:
                    metadata = str(data[16:end], "utf-8")
                except UnicodeDecodeError:
                    pass
                else:
                    return OffsetCommitValue(
                        offset=offset,
                        metadata=metadata,
                        commit_timestamp=_I64.unpack_from(data, end)[0],
                        leader_epoch=word,
                    )
        elif version == 1:
            meta_len = word >> 16  # the int16 length right after the offset (signed: shift)
            end = 12 + max(meta_len, 0)
            if end + 16 <= size:
                try:
                    metadata = str(data[12:end], "utf-8")
                except UnicodeDecodeError:
                    pass
                else:
                    commit_timestamp, expire_timestamp = _I64_I64.unpack_from(data, end)
                    return OffsetCommitValue(
                        offset=offset,
                        metadata=metadata,
                        commit_timestamp=commit_timestamp,
                        expire_timestamp=expire_timestamp,
                    )
    return _decode_offset_commit_value(data)


@_decoder
def _decode_offset_commit_value(data: bytes) -> OffsetCommitValue:
    r = Reader(data)
    v = r.int16()
    if not 0 <= v <= 4:
        raise RecordDecodeError(f"OffsetCommitValue version {v} not supported")
    flexible = v >= 4
    offset = r.int64()
    leader_epoch = r.int32() if v >= 3 else -1
    metadata = r.nullable_string(flexible) or ""
    commit_timestamp = r.int64()
    expire_timestamp = r.int64() if v == 1 else -1
    if flexible:
        r.skip_tagged_fields()
    return OffsetCommitValue(
        offset=offset,
        metadata=metadata,
        commit_timestamp=commit_timestamp,
        leader_epoch=leader_epoch,
        expire_timestamp=expire_timestamp,
    )


# ---------------------------------------------------------------------------------------------
# GroupMetadataValue
# ---------------------------------------------------------------------------------------------


def encode_group_metadata_value(
    value: GroupMetadataValue, version: int = GROUP_METADATA_VALUE_VERSION
) -> bytes:
    """Encode at ``version`` (default 3, what Kafka writes)."""
    v = version
    if not 0 <= v <= 4:
        raise ValueError(f"GroupMetadataValue version {v} not supported")
    flexible = v >= 4
    out = [
        _I16.pack(v),
        _string(value.protocol_type, flexible),
        _I32.pack(value.generation),
        _string(value.protocol, flexible),
        _string(value.leader, flexible),
    ]
    if v >= 2:
        out.append(_I64.pack(value.current_state_timestamp))
    out.append(write_uvarint(len(value.members) + 1) if flexible else _I32.pack(len(value.members)))
    for m in value.members:
        out.append(_string(m.member_id, flexible))
        if v >= 3:
            out.append(_string(m.group_instance_id, flexible))
        out.append(_string(m.client_id, flexible))
        out.append(_string(m.client_host, flexible))
        if v >= 1:
            out.append(_I32.pack(m.rebalance_timeout))
        out.append(_I32.pack(m.session_timeout))
        out.append(_bytes(m.subscription, flexible))
        out.append(_bytes(m.assignment, flexible))
        if flexible:
            out.append(b"\x00")
    if flexible:
        out.append(b"\x00")
    return b"".join(out)


@_decoder
def decode_group_metadata_value(data: bytes) -> GroupMetadataValue:
    r = Reader(data)
    v = r.int16()
    if not 0 <= v <= 4:
        raise RecordDecodeError(f"GroupMetadataValue version {v} not supported")
    flexible = v >= 4
    protocol_type = r.string(flexible)
    generation = r.int32()
    protocol = r.nullable_string(flexible)
    leader = r.nullable_string(flexible)
    timestamp = r.int64() if v >= 2 else -1
    members = []
    for _ in range(max(r.array_length(flexible), 0)):
        member_id = r.string(flexible)
        instance_id = r.nullable_string(flexible) if v >= 3 else None
        client_id = r.string(flexible)
        client_host = r.string(flexible)
        rebalance_timeout = r.int32() if v >= 1 else -1
        session_timeout = r.int32()
        subscription = r.nullable_bytes(flexible) or b""
        assignment = r.nullable_bytes(flexible) or b""
        if flexible:
            r.skip_tagged_fields()
        members.append(
            MemberMetadata(
                member_id=member_id,
                group_instance_id=instance_id,
                client_id=client_id,
                client_host=client_host,
                rebalance_timeout=rebalance_timeout,
                session_timeout=session_timeout,
                subscription=subscription,
                assignment=assignment,
            )
        )
    if flexible:
        r.skip_tagged_fields()
    return GroupMetadataValue(
        protocol_type=protocol_type,
        generation=generation,
        protocol=protocol,
        leader=leader,
        current_state_timestamp=timestamp,
        members=tuple(members),
    )


# ---------------------------------------------------------------------------------------------
# Whole records
# ---------------------------------------------------------------------------------------------

RecordValue = OffsetCommitValue | GroupMetadataValue


def encode_record(key: RecordKey, value: RecordValue | None) -> tuple[bytes, bytes | None]:
    """Encode a (key, value) pair; ``value=None`` gives a tombstone."""
    if value is None:
        return encode_key(key), None
    if isinstance(key, OffsetCommitKey) and isinstance(value, OffsetCommitValue):
        return encode_key(key), encode_offset_commit_value(value)
    if isinstance(key, GroupMetadataKey) and isinstance(value, GroupMetadataValue):
        return encode_key(key), encode_group_metadata_value(value)
    raise TypeError(f"key {type(key).__name__} does not match value {type(value).__name__}")


def decode_record(key: bytes, value: bytes | None) -> tuple[RecordKey, RecordValue | None] | None:
    """Decode a ``__consumer_offsets`` record; None if its type is not one this coordinator owns."""
    decoded_key = decode_key(key)
    if decoded_key is None:
        return None
    if value is None:
        return decoded_key, None
    if isinstance(decoded_key, OffsetCommitKey):
        return decoded_key, decode_offset_commit_value(value)
    return decoded_key, decode_group_metadata_value(value)
