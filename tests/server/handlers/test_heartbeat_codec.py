"""The hand-written Heartbeat codec reads and writes what kio's generic codec does, for every
version we serve, and refuses truncated requests."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from exactly.client.wire import encode_request
from exactly.protocol.apis import VERSION_RANGES, ApiKey, build, encode_response, schema
from exactly.protocol.header import parse_request_header, skip_tagged_fields
from exactly.protocol.primitives import WireFormatError
from exactly.server.handlers import heartbeat

LO, HI = VERSION_RANGES[ApiKey.HEARTBEAT]
VERSIONS = list(range(LO, HI + 1))


def body(version: int, instance: str | None) -> tuple[bytearray, int]:
    api = schema(ApiKey.HEARTBEAT, version)
    request = build(
        api.request_type,
        group_id="grüppe",
        generation_id=2**31 - 5,
        member_id="member-1-abc",
        group_instance_id=instance,
    )
    payload = bytearray(encode_request(request, 4, "c")[4:])
    _header, pos = parse_request_header(payload)
    if api.request_flexible:
        pos = skip_tagged_fields(payload, pos)
    return payload, pos


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("instance", [None, "static-1"])
def test_request_reads_as_kio_reads_it(version: int, instance: str | None) -> None:
    payload, pos = body(version, instance)
    theirs, _size = schema(ApiKey.HEARTBEAT, version).read_request(bytes(payload), pos)
    ours = heartbeat.parse_request(payload, pos, version)
    assert (ours.group_id, ours.generation_id, ours.member_id) == (
        theirs.group_id,
        theirs.generation_id,
        theirs.member_id,
    )
    assert ours.group_instance_id == getattr(theirs, "group_instance_id", None)


@pytest.mark.parametrize("version", VERSIONS)
def test_truncated_request_is_refused(version: int) -> None:
    payload, pos = body(version, "static-1")
    for cut in range(pos, len(payload)):
        with pytest.raises(WireFormatError):
            heartbeat.parse_request(payload[:cut], pos, version)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    "code", [ErrorCode.none, ErrorCode.rebalance_in_progress, ErrorCode.unknown_member_id]
)
def test_response_is_kio_bytes(version: int, code: ErrorCode) -> None:
    api = schema(ApiKey.HEARTBEAT, version)
    expected = encode_response(api, build(api.response_type, error_code=code))
    assert heartbeat.encode_response(version, int(code)) == bytes(expected)
