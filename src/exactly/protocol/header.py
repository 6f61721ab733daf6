"""Request and response headers, parsed and written by hand.

Why by hand: the header decides which schema parses the body, and it must be read even for
requests we then refuse (unknown API key or version), so it cannot go through the schema
registry. It is also on every request's path, where one ``struct`` call beats a generic reader.

Request header v1: api_key int16, api_version int16, correlation_id int32, client_id nullable
string (int16 length). v2 (flexible requests) adds a tagged-field section, which Kafka skips
whatever the tags are, and so do we. Response header v0: correlation_id; v1 adds an empty tag
section. ApiVersions responses always use v0 (clients parse them before knowing versions).
The v2 tagged-field section is skipped with ``skip_tagged_fields`` of the primitives codec,
re-exported here beside the header parser that needs it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from exactly.frozen import quick_init
from exactly.protocol.primitives import WireFormatError, skip_tagged_fields

_FIXED = struct.Struct(">hhih")
_CORRELATION = struct.Struct(">i")


class HeaderError(WireFormatError):
    """The request header cannot be parsed; Kafka closes such connections."""


@quick_init
@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


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


__all__ = [
    "HeaderError",
    "RequestHeader",
    "parse_request_header",
    "response_header",
    "skip_tagged_fields",
]
