"""Request and response headers, parsed and written by hand.

Why by hand: the header decides which schema parses the body, and it must be read even for
requests we then refuse (unknown API key or version), so it cannot go through the schema
registry. It is also on every request's path, where one ``struct`` call beats a generic reader.

Request header v1: api_key int16, api_version int16, correlation_id int32, client_id nullable
string (int16 length). v2 (flexible requests) adds a tagged-field section, which Kafka skips
whatever the tags are, and so do we. Response header v0: correlation_id; v1 adds an empty tag
section. ApiVersions responses always use v0 (clients parse them before knowing versions).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

_FIXED = struct.Struct(">hhih")
_CORRELATION = struct.Struct(">i")


class HeaderError(Exception):
    """The request header cannot be parsed; Kafka closes such connections."""


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def read_uvarint(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise HeaderError("truncated unsigned varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 28:
            raise HeaderError("unsigned varint too long")


def write_uvarint(value: int) -> bytes:
    """The unsigned varint encoding of ``value`` (compact lengths, tag numbers and sizes)."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def skip_tagged_fields(buf: bytes | bytearray | memoryview, pos: int) -> int:
    count, pos = read_uvarint(buf, pos)
    for _ in range(count):
        _tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        pos += size
        if pos > len(buf):
            raise HeaderError("truncated tagged field")
    return pos


def parse_request_header(frame: bytes | bytearray) -> tuple[RequestHeader, int]:
    """Parse the v1 part of the header; returns the header and the offset after client_id.

    The caller skips the v2 tagged fields with ``skip_tagged_fields`` once it knows the request
    is flexible (that depends on the API and version, known only after this call)."""
    if len(frame) < _FIXED.size:
        raise HeaderError(f"request header needs {_FIXED.size} bytes, got {len(frame)}")
    api_key, api_version, correlation_id, client_len = _FIXED.unpack_from(frame, 0)
    pos = _FIXED.size
    client_id: str | None = None
    if client_len >= 0:
        end = pos + client_len
        if end > len(frame):
            raise HeaderError("client_id runs past the end of the frame")
        client_id = bytes(frame[pos:end]).decode("utf-8", errors="replace")
        pos = end
    return RequestHeader(api_key, api_version, correlation_id, client_id), pos


def response_header(correlation_id: int, flexible: bool) -> bytes:
    if flexible:
        return _CORRELATION.pack(correlation_id) + b"\x00"
    return _CORRELATION.pack(correlation_id)
