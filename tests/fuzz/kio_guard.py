"""Which fuzz inputs carry an array length that cannot fit the request (the kind that made kio's
native reader abort the process before the dispatcher guarded against it: src/exactly/protocol/guard.py).

The broker now closes the connection on such a request itself, so the fuzzers send them by default;
``would_abort`` remains to count them and for ``--guard`` runs against an older broker.
"""

from __future__ import annotations

from exactly.protocol.apis import VERSION_RANGES, schema
from exactly.protocol.guard import overlong_array
from exactly.protocol.header import HeaderError, parse_request_header, skip_tagged_fields
from exactly.protocol.primitives import WireFormatError


def would_abort(payload: bytes | bytearray) -> str | None:
    """For a whole request payload: does a kio-parsed body carry an overlong array? -> its path."""
    from exactly.server.handlers import HANDLERS, PARSERS

    try:
        header, pos = parse_request_header(payload)
    except HeaderError:
        return None
    key = header.api_key
    if key not in HANDLERS or key in PARSERS or key not in VERSION_RANGES:
        return None
    lo, hi = VERSION_RANGES[key]
    if not lo <= header.api_version <= hi:
        return None
    api = schema(key, header.api_version)
    try:
        if api.request_flexible:
            pos = skip_tagged_fields(payload, pos)
    except WireFormatError:
        return None
    return overlong_array(api.request_type, payload, pos)
