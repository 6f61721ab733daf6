"""Heartbeat (12) v0-v4: keeps a member's session alive; REBALANCE_IN_PROGRESS tells it to
re-join. Answered at once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.coordinator.group.api import HeartbeatRequestData, HeartbeatResponseData
from exactly.protocol.apis import ApiKey, build
from exactly.server.authz import GROUP, READ, authorize
from exactly.server.clock import now_ms

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.HEARTBEAT


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    runtime = broker.groups
    if not authorize(broker, ctx, READ, GROUP, request.group_id):
        response = HeartbeatResponseData(error_code=ErrorCode.group_authorization_failed)
    elif (load_error := runtime.load_error_for(request.group_id)) is not ErrorCode.none:
        response = HeartbeatResponseData(error_code=load_error)
    else:
        data = HeartbeatRequestData(
            group_id=request.group_id,
            generation_id=request.generation_id,
            member_id=request.member_id,
            group_instance_id=getattr(request, "group_instance_id", None),
        )
        coordinator = runtime.coordinator
        response = await runtime.call(lambda token: coordinator.heartbeat(data, now_ms(), token))
    broker.metrics.error(API_KEY, response.error_code)
    return build(ctx.api.response_type, error_code=response.error_code)
