"""DescribeGroups (15) v0-v5: state, protocol and members of each group.

An unknown group is described as Dead without error (v0-v5). From v3 the client may ask for the
authorized operations; with no authorizer Kafka reports every operation a group supports, with
one those the caller's ACLs allow. A group the caller may not DESCRIBE gets
GROUP_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.coordinator.group.api import DescribedGroup
from exactly.protocol.apis import ApiKey, build
from exactly.server.authz import DELETE, DESCRIBE, GROUP, READ, authorize

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.DESCRIBE_GROUPS

AUTHORIZED_OPERATIONS_OMITTED = -(2**31)
# AclOperation codes READ (3), DELETE (6), DESCRIBE (8): what a group resource supports.
GROUP_OPERATIONS = (1 << 3) | (1 << 6) | (1 << 8)


def _authorized_operations(broker: Broker, ctx: RequestContext, group_id: str) -> int:
    """The bit set of the group operations the caller may do (all of them without an authorizer),
    as Kafka reports them (KIP-430); asking is not a denial, so nothing is audited."""
    if broker.authorizer is None:
        return GROUP_OPERATIONS
    return sum(
        1 << op
        for op in (READ, DELETE, DESCRIBE)
        if authorize(broker, ctx, op, GROUP, group_id, log_denied=False)
    )


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    runtime = broker.groups
    refused = {
        g: ErrorCode.group_authorization_failed
        for g in request.groups
        if not authorize(broker, ctx, DESCRIBE, GROUP, g)
    }
    refused.update(
        (g, code)
        for g in request.groups
        if g not in refused and (code := runtime.load_error_for(g)) is not ErrorCode.none
    )
    ours = [g for g in request.groups if g not in refused]
    found = iter(runtime.coordinator.describe_groups(ours, ctx.version) if ours else ())
    described = [
        DescribedGroup(group_id=g, error_code=refused[g], group_state="") if g in refused else next(found)
        for g in request.groups
    ]
    include_ops = bool(getattr(request, "include_authorized_operations", False))
    mod = ctx.api.response_module
    groups = []
    for g in described:
        broker.metrics.error(API_KEY, g.error_code)
        ops = (
            _authorized_operations(broker, ctx, g.group_id)
            if include_ops and g.error_code is ErrorCode.none
            else AUTHORIZED_OPERATIONS_OMITTED
        )
        groups.append(
            build(
                mod.DescribedGroup,
                error_code=g.error_code,
                group_id=g.group_id,
                group_state=g.group_state,
                protocol_type=g.protocol_type,
                protocol_data=g.protocol_data,
                members=tuple(
                    build(
                        mod.DescribedGroupMember,
                        member_id=m.member_id,
                        group_instance_id=m.group_instance_id,
                        client_id=m.client_id,
                        client_host=m.client_host,
                        member_metadata=m.member_metadata,
                        member_assignment=m.member_assignment,
                    )
                    for m in g.members
                ),
                authorized_operations=ops,
            )
        )
    return build(ctx.api.response_type, groups=tuple(groups))
