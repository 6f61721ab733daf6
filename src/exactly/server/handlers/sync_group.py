"""SyncGroup (14) v0-v5: the leader hands in the assignment; every member gets its own.

A follower's request long-polls until the leader's assignment has been appended to
``__consumer_offsets``. From v5 ``protocol_type`` and ``protocol_name`` are mandatory: Kafka
answers INCONSISTENT_GROUP_PROTOCOL when either is missing, before asking the coordinator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.coordinator.group.api import (
    SyncGroupAssignment,
    SyncGroupRequestData,
    SyncGroupResponseData,
)
from exactly.protocol.apis import ApiKey, build
from exactly.server.authz import GROUP, READ, authorize
from exactly.server.clock import now_ms

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.SYNC_GROUP


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    runtime = broker.groups
    protocol_type = getattr(request, "protocol_type", None)
    protocol_name = getattr(request, "protocol_name", None)
    if not authorize(broker, ctx, READ, GROUP, request.group_id):
        response = SyncGroupResponseData(error_code=ErrorCode.group_authorization_failed)
    elif (load_error := runtime.load_error_for(request.group_id)) is not ErrorCode.none:
        response = SyncGroupResponseData(error_code=load_error)
    elif ctx.version >= 5 and (protocol_type is None or protocol_name is None):
        response = SyncGroupResponseData(error_code=ErrorCode.inconsistent_group_protocol)
    else:
        data = SyncGroupRequestData(
            group_id=request.group_id,
            generation_id=request.generation_id,
            member_id=request.member_id,
            group_instance_id=getattr(request, "group_instance_id", None),
            protocol_type=protocol_type,
            protocol_name=protocol_name,
            assignments=tuple(SyncGroupAssignment(a.member_id, a.assignment) for a in request.assignments),
        )
        coordinator = runtime.coordinator
        response = await runtime.call(lambda token: coordinator.sync_group(data, now_ms(), token))
    broker.metrics.error(API_KEY, response.error_code)
    return build(
        ctx.api.response_type,
        error_code=response.error_code,
        protocol_type=response.protocol_type,
        protocol_name=response.protocol_name,
        assignment=response.assignment,
    )
