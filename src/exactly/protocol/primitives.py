"""Kafka's primitive encodings, in one place: varints, and a bounded cursor reader and writer.

Every byte format this broker speaks or stores is built from the same few primitives (Kafka's
``ByteUtils`` and the generated message code): big-endian fixed-width integers, unsigned varints
(compact lengths, tag numbers and sizes of flexible versions), zig-zag varints and varlongs (the
fields of a v2 record), and strings/bytes/arrays with either a classic fixed-width length or a
compact (unsigned varint ``n + 1``, 0 = null) one. The wire protocol, record batches, the
``__transaction_state`` and ``__consumer_offsets`` record codecs and the CLI's wire client all
read and write them through this module, so they agree on the limits.

Limits (Kafka's ``ByteUtils``): an unsigned varint and a zig-zag varint are at most 5 bytes (an
int32), a varlong at most 10 bytes (an int64); a longer encoding is an error, not a big number.
Where we differ: Kafka keeps only the low 32 bits of a 5-byte varint (so the unused top bits of
the fifth byte silently wrap the value); we return the full value, which is then too large for
any length check and refused there. Reading past the end, a negative or oversized length, or an
overlong varint all raise :class:`WireFormatError` (a ``ValueError``): one error type, never an
``IndexError`` or ``struct.error`` from a short buffer.

The free functions (``read_uvarint`` and friends) take and return a position instead of keeping
a cursor object: they sit on the broker's per-request and per-batch paths (the produce parser,
control markers), where a method call and an attribute store per field would cost more than the
decoding itself. One- and two-byte values (every length below 16 KiB) take an unrolled path.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

Buffer = bytes | bytearray | memoryview

UVARINT_MAX_BYTES = 5
VARINT_MAX_BYTES = 5
VARLONG_MAX_BYTES = 10

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_SINGLE = tuple(bytes((i,)) for i in range(0x80))


class WireFormatError(ValueError):
    """The bytes do not follow Kafka's primitive encodings: truncated, an overlong varint, or a
    length that is negative where no null is allowed or runs past the end."""


# ---- varints ---------------------------------------------------------------------------------


def _read_unsigned(buf: Buffer, pos: int, max_bytes: int) -> tuple[int, int]:
    """The general case of a varint: up to ``max_bytes`` 7-bit groups, least significant first."""
    result = 0
    shift = 0
    limit = pos + max_bytes
    while True:
        if pos >= limit:
            raise WireFormatError(f"varint longer than {max_bytes} bytes")
        try:
            b = buf[pos]
        except IndexError:
            raise WireFormatError("truncated varint") from None
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def read_uvarint(buf: Buffer, pos: int) -> tuple[int, int]:
    """(value, next position) of the unsigned varint at ``pos`` (at most 5 bytes)."""
    try:
        b = buf[pos]
        if b < 0x80:
            return b, pos + 1
        b2 = buf[pos + 1]
        if b2 < 0x80:
            return (b & 0x7F) | (b2 << 7), pos + 2
    except IndexError:
        raise WireFormatError("truncated varint") from None
    return _read_unsigned(buf, pos, UVARINT_MAX_BYTES)


def read_varint(buf: Buffer, pos: int) -> tuple[int, int]:
    """(value, next position) of the zig-zag int32 varint at ``pos`` (at most 5 bytes)."""
    try:
        v = buf[pos]
        if v < 0x80:
            return (v >> 1) ^ -(v & 1), pos + 1
        b2 = buf[pos + 1]
        if b2 < 0x80:
            v = (v & 0x7F) | (b2 << 7)
            return (v >> 1) ^ -(v & 1), pos + 2
    except IndexError:
        raise WireFormatError("truncated varint") from None
    v, pos = _read_unsigned(buf, pos, VARINT_MAX_BYTES)
    return (v >> 1) ^ -(v & 1), pos


def read_varlong(buf: Buffer, pos: int) -> tuple[int, int]:
    """(value, next position) of the zig-zag int64 varint at ``pos`` (at most 10 bytes)."""
    try:
        v = buf[pos]
        if v < 0x80:
            return (v >> 1) ^ -(v & 1), pos + 1
        b2 = buf[pos + 1]
        if b2 < 0x80:
            v = (v & 0x7F) | (b2 << 7)
            return (v >> 1) ^ -(v & 1), pos + 2
    except IndexError:
        raise WireFormatError("truncated varint") from None
    v, pos = _read_unsigned(buf, pos, VARLONG_MAX_BYTES)
    return (v >> 1) ^ -(v & 1), pos


def append_uvarint(value: int, out: bytearray) -> None:
    """Append the unsigned varint of ``value`` (0 <= value < 2**32) to ``out``."""
    if not 0 <= value <= 0xFFFFFFFF:
        raise ValueError(f"unsigned varint out of range: {value}")
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def write_uvarint(value: int) -> bytes:
    """The unsigned varint encoding of ``value`` as its own ``bytes``."""
    if 0 <= value < 0x80:
        return _SINGLE[value]
    out = bytearray()
    append_uvarint(value, out)
    return bytes(out)


def append_varint(value: int, out: bytearray) -> None:
    """Append the zig-zag varint of the int32 ``value``."""
    if not -(2**31) <= value < 2**31:
        raise ValueError(f"varint out of int32 range: {value}")
    _write_zigzag((value << 1) ^ (value >> 31), out)


def append_varlong(value: int, out: bytearray) -> None:
    """Append the zig-zag varlong of the int64 ``value``."""
    if not -(2**63) <= value < 2**63:
        raise ValueError(f"varlong out of int64 range: {value}")
    _write_zigzag((value << 1) ^ (value >> 63), out)


def _write_zigzag(v: int, out: bytearray) -> None:
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


# ---- tagged fields ---------------------------------------------------------------------------


def skip_tagged_fields(buf: Buffer, pos: int) -> int:
    """The position after the tagged-field section at ``pos`` (every tag skipped, as Kafka skips
    the ones it does not know)."""
    count, pos = read_uvarint(buf, pos)
    for _ in range(count):
        _tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        pos += size
        if pos > len(buf):
            raise WireFormatError("truncated tagged field")
    return pos


def append_tagged_fields(tags: Iterable[tuple[int, bytes]], out: bytearray) -> None:
    """Append a tagged-field section; Kafka requires the tags in ascending order."""
    ordered = sorted(tags)
    append_uvarint(len(ordered), out)
    for tag, payload in ordered:
        append_uvarint(tag, out)
        append_uvarint(len(payload), out)
        out += payload


# ---- cursor ----------------------------------------------------------------------------------


class Reader:
    """A bounds-checked cursor over one buffer; every short read raises WireFormatError.

    For the cold codecs (coordinator log records, the CLI's hand-written response readers).
    ``take`` returns a memoryview into the buffer (no copy); strings and bytes are copied out.
    """

    __slots__ = ("buf", "pos")

    def __init__(self, buf: Buffer, pos: int = 0) -> None:
        self.buf = memoryview(buf)
        self.pos = pos

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise WireFormatError(f"truncated: {n} bytes wanted at byte {self.pos} of {len(self.buf)}")
        chunk = self.buf[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def unpack(self, st: struct.Struct) -> tuple[int, ...]:
        return tuple(st.unpack(self.take(st.size)))

    def int8(self) -> int:
        return int(_I8.unpack(self.take(1))[0])

    def int16(self) -> int:
        return int(_I16.unpack(self.take(2))[0])

    def int32(self) -> int:
        return int(_I32.unpack(self.take(4))[0])

    def int64(self) -> int:
        return int(_I64.unpack(self.take(8))[0])

    def uvarint(self) -> int:
        value, self.pos = read_uvarint(self.buf, self.pos)
        return value

    def varint(self) -> int:
        value, self.pos = read_varint(self.buf, self.pos)
        return value

    def varlong(self) -> int:
        value, self.pos = read_varlong(self.buf, self.pos)
        return value

    def length(self, compact: bool, classic: struct.Struct = _I32) -> int:
        """A length prefix: compact (uvarint n + 1) or classic (``classic``, int32 by default);
        -1 is null."""
        return self.uvarint() - 1 if compact else int(classic.unpack(self.take(classic.size))[0])

    def nullable_string(self, compact: bool) -> str | None:
        n = self.length(compact, _I16)
        if n < 0:
            return None
        try:
            return str(self.take(n), "utf-8")
        except UnicodeDecodeError as exc:
            raise WireFormatError("invalid UTF-8 in a string") from exc

    def string(self, compact: bool) -> str:
        value = self.nullable_string(compact)
        if value is None:
            raise WireFormatError("null string where a string is required")
        return value

    def nullable_bytes(self, compact: bool) -> bytes | None:
        n = self.length(compact)
        return None if n < 0 else bytes(self.take(n))

    def array_length(self, compact: bool) -> int:
        """An array's element count, -1 for null. A count larger than the bytes left cannot be
        valid (every element takes at least one byte) and is refused before anyone loops on it."""
        n = self.length(compact)
        if n > len(self.buf) - self.pos:
            raise WireFormatError(f"array of {n} elements in {len(self.buf) - self.pos} bytes")
        return n

    def tagged_fields(self) -> dict[int, bytes]:
        """The tagged-field section as {tag: payload}; a repeated tag is an error (Kafka's too)."""
        tags: dict[int, bytes] = {}
        for _ in range(self.uvarint()):
            tag = self.uvarint()
            if tag in tags:
                raise WireFormatError(f"duplicate tagged field {tag}")
            tags[tag] = bytes(self.take(self.uvarint()))
        return tags

    def skip_tagged_fields(self) -> None:
        self.pos = skip_tagged_fields(self.buf, self.pos)

    def remaining(self) -> int:
        return len(self.buf) - self.pos

    def done(self) -> bool:
        return self.pos == len(self.buf)


class Writer:
    """Appends primitives to one growing ``bytearray`` (``out``)."""

    __slots__ = ("out",)

    def __init__(self, initial: bytes = b"") -> None:
        self.out = bytearray(initial)

    def int8(self, value: int) -> None:
        self.out += _I8.pack(value)

    def int16(self, value: int) -> None:
        self.out += _I16.pack(value)

    def int32(self, value: int) -> None:
        self.out += _I32.pack(value)

    def int64(self, value: int) -> None:
        self.out += _I64.pack(value)

    def uvarint(self, value: int) -> None:
        append_uvarint(value, self.out)

    def varint(self, value: int) -> None:
        append_varint(value, self.out)

    def varlong(self, value: int) -> None:
        append_varlong(value, self.out)

    def length(self, n: int, compact: bool, classic: struct.Struct = _I32) -> None:
        """A length prefix; ``n`` = -1 writes null."""
        if compact:
            append_uvarint(n + 1, self.out)
        else:
            self.out += classic.pack(n)

    def string(self, value: str | None, compact: bool) -> None:
        if value is None:
            self.length(-1, compact, _I16)
            return
        raw = value.encode("utf-8")
        if not compact and len(raw) > 0x7FFF:
            raise ValueError("string longer than 32767 bytes")
        self.length(len(raw), compact, _I16)
        self.out += raw

    def bytes_(self, value: bytes | None, compact: bool) -> None:
        if value is None:
            self.length(-1, compact)
            return
        self.length(len(value), compact)
        self.out += value

    def tagged_fields(self, tags: Iterable[tuple[int, bytes]] = ()) -> None:
        append_tagged_fields(tags, self.out)


__all__ = [
    "UVARINT_MAX_BYTES",
    "VARINT_MAX_BYTES",
    "VARLONG_MAX_BYTES",
    "Buffer",
    "Reader",
    "WireFormatError",
    "Writer",
    "append_tagged_fields",
    "append_uvarint",
    "append_varint",
    "append_varlong",
    "read_uvarint",
    "read_varint",
    "read_varlong",
    "skip_tagged_fields",
    "write_uvarint",
]
