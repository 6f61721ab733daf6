"""ListGroups (16) v0-v4: every group this coordinator knows (v4: filtered by state)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import ApiKey, build
from exactly.server.authz import DESCRIBE, GROUP, authorize, authorize_cluster

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.LIST_GROUPS


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    runtime = broker.groups
    error = runtime.load_error
    broker.metrics.error(API_KEY, error)
    if error is not ErrorCode.none:
        return build(ctx.api.response_type, error_code=error, groups=())
    listed = runtime.coordinator.list_groups(
        getattr(request, "states_filter", None) or (), getattr(request, "types_filter", None) or ()
    )
    if not authorize_cluster(
        broker, ctx, DESCRIBE, log_denied=False
    ):  # then filtered by group, never an error
        listed = [g for g in listed if authorize(broker, ctx, DESCRIBE, GROUP, g.group_id, log_denied=False)]
    mod = ctx.api.response_module
    return build(
        ctx.api.response_type,
        error_code=ErrorCode.none,
        groups=tuple(
            build(
                mod.ListedGroup,
                group_id=g.group_id,
                protocol_type=g.protocol_type,
                group_state=g.group_state,
                group_type=g.group_type,
            )
            for g in sorted(listed, key=lambda g: g.group_id)
        ),
    )
