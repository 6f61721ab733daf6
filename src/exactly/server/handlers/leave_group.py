"""LeaveGroup (13) v0-v5: members leave at once (v3+ batched, KIP-345 admin removal by
``group.instance.id``).

v0-v2 name one member and have only a top-level error: the coordinator's top-level error, or
else that member's. For v3+ an unknown group is answered like Kafka: no top-level error and
UNKNOWN_MEMBER_ID for every member.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.coordinator.group.api import (
    LeaveGroupRequestData,
    LeaveGroupResponseData,
    LeaveMember,
    LeaveMemberResponse,
)
from exactly.protocol.apis import ApiKey, build
from exactly.server.authz import GROUP, READ, authorize
from exactly.server.clock import now_ms

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.LEAVE_GROUP
BATCHED_VERSION = 3


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    runtime = broker.groups
    if ctx.version < BATCHED_VERSION:
        members: tuple[LeaveMember, ...] = (LeaveMember(request.member_id),)
    else:
        members = tuple(
            LeaveMember(m.member_id, m.group_instance_id, getattr(m, "reason", None)) for m in request.members
        )
    if not authorize(broker, ctx, READ, GROUP, request.group_id):
        response = LeaveGroupResponseData(error_code=ErrorCode.group_authorization_failed)
    elif (load_error := runtime.load_error_for(request.group_id)) is not ErrorCode.none:
        response = LeaveGroupResponseData(error_code=load_error)
    else:
        data = LeaveGroupRequestData(group_id=request.group_id, members=members)
        coordinator = runtime.coordinator
        response = await runtime.call(lambda token: coordinator.leave_group(data, now_ms(), token))
    if ctx.version < BATCHED_VERSION:
        error = response.error_code
        if error is ErrorCode.none and response.members:
            error = response.members[0].error_code
        broker.metrics.error(API_KEY, error)
        return build(ctx.api.response_type, error_code=error)
    if response.error_code is ErrorCode.unknown_member_id and not response.members:
        # Unknown group: Kafka reports it per member, not at the top level.
        response = LeaveGroupResponseData(
            members=tuple(
                LeaveMemberResponse(m.member_id, m.group_instance_id, ErrorCode.unknown_member_id)
                for m in members
            )
        )
    broker.metrics.error(API_KEY, response.error_code)
    mod = ctx.api.response_module
    return build(
        ctx.api.response_type,
        error_code=response.error_code,
        members=tuple(
            build(
                mod.MemberResponse,
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                error_code=m.error_code,
            )
            for m in response.members
        ),
    )
