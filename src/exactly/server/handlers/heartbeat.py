"""Heartbeat (12) v0-v4: keeps a member's session alive; REBALANCE_IN_PROGRESS tells it to
re-join. Answered at once.

Request and response are read and written by hand: every member of every group sends one each
``heartbeat.interval.ms``, and kio's reader (after the overlong-array guard's walk) and writer
were half of a heartbeat's CPU in ``bench/dispatch_micro.py``. Layout (Kafka's
HeartbeatRequest/Response.json): group_id, generation_id, member_id, group_instance_id (v3+);
answer throttle_time_ms (v1+), error_code; v4 is flexible (compact strings, tagged fields).
Equivalence with kio is checked by tests/server/handlers/test_heartbeat_codec.py.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.coordinator.group.api import HeartbeatRequestData, HeartbeatResponseData
from exactly.protocol.apis import ApiKey
from exactly.protocol.primitives import Reader
from exactly.server.authz import GROUP, READ, authorize
from exactly.server.clock import now_ms

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.HEARTBEAT
_V0 = struct.Struct(">h")  # error code
_V1 = struct.Struct(">ih")  # throttle time, error code
_NO_TAGS = b"\x00"


def parse_request(buf: bytes | bytearray, pos: int, version: int) -> HeartbeatRequestData:
    flexible = version >= 4
    r = Reader(buf, pos)
    group_id = r.string(flexible)
    generation_id = r.int32()
    member_id = r.string(flexible)
    group_instance_id = r.nullable_string(flexible) if version >= 3 else None
    if flexible:
        r.skip_tagged_fields()
    return HeartbeatRequestData(
        group_id=group_id,
        generation_id=generation_id,
        member_id=member_id,
        group_instance_id=group_instance_id,
    )


def encode_response(version: int, error_code: int) -> bytes:
    if version == 0:
        return _V0.pack(error_code)
    body = _V1.pack(0, error_code)
    return body + _NO_TAGS if version >= 4 else body


async def handle(broker: Broker, ctx: RequestContext, request: HeartbeatRequestData) -> Any:
    runtime = broker.groups
    if not authorize(broker, ctx, READ, GROUP, request.group_id):
        response = HeartbeatResponseData(error_code=ErrorCode.group_authorization_failed)
    elif (load_error := runtime.load_error_for(request.group_id)) is not ErrorCode.none:
        response = HeartbeatResponseData(error_code=load_error)
    else:
        coordinator = runtime.coordinator
        response = await runtime.call(lambda token: coordinator.heartbeat(request, now_ms(), token))
    broker.metrics.error(API_KEY, response.error_code)
    return encode_response(ctx.version, int(response.error_code))
