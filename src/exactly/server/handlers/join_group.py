"""JoinGroup (11) v0-v9: join (or re-join) a classic group; answered when the join phase ends.

The request long-polls: the coordinator parks it until every member re-joined or the rebalance
timeout fired, then its reply (addressed by the request's token) resolves the future this handler
awaits. v0 has no rebalance timeout (the session timeout serves for both); v4+ dynamic members get
MEMBER_ID_REQUIRED first (KIP-394); v9 lets a re-joining static leader skip the assignment
(KIP-814). ``protocol_type`` and ``protocol_name`` are nullable from v7; older versions answer ""
(Kafka's ``NoProtocol``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.coordinator.group.api import (
    JoinGroupRequestData,
    JoinGroupResponseData,
    Protocol,
)
from exactly.protocol.apis import ApiKey, build
from exactly.server.authz import GROUP, READ, authorize
from exactly.server.clock import now_ms
from exactly.server.group_runtime import client_host, millis

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.JOIN_GROUP


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    runtime = broker.groups
    if not authorize(broker, ctx, READ, GROUP, request.group_id):
        response = JoinGroupResponseData(
            error_code=ErrorCode.group_authorization_failed, member_id=request.member_id
        )
    elif (load_error := runtime.load_error_for(request.group_id)) is not ErrorCode.none:
        response = JoinGroupResponseData(error_code=load_error, member_id=request.member_id)
    else:
        session_ms = millis(request.session_timeout)
        rebalance = getattr(request, "rebalance_timeout", None)
        data = JoinGroupRequestData(
            group_id=request.group_id,
            session_timeout_ms=session_ms,
            rebalance_timeout_ms=session_ms if rebalance is None else millis(rebalance),
            member_id=request.member_id,
            protocol_type=request.protocol_type,
            protocols=tuple(Protocol(p.name, p.metadata) for p in request.protocols),
            group_instance_id=getattr(request, "group_instance_id", None),
            reason=getattr(request, "reason", None),
            api_version=ctx.version,
            client_id=ctx.header.client_id or "",
            client_host=client_host(ctx.peer),
        )
        coordinator = runtime.coordinator
        response = await runtime.call(lambda token: coordinator.join_group(data, now_ms(), token))
    broker.metrics.error(API_KEY, response.error_code)
    mod = ctx.api.response_module
    nullable = ctx.version >= 7
    return build(
        ctx.api.response_type,
        error_code=response.error_code,
        generation_id=response.generation_id,
        protocol_type=response.protocol_type,
        protocol_name=response.protocol_name if nullable else (response.protocol_name or ""),
        leader=response.leader,
        skip_assignment=response.skip_assignment,
        member_id=response.member_id,
        members=tuple(
            build(
                mod.JoinGroupResponseMember,
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                metadata=m.metadata,
            )
            for m in response.members
        ),
    )
