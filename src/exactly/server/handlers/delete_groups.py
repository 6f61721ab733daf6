"""DeleteGroups (42) v0-v2: delete Empty groups and their offsets (tombstones), answered after
the append. Duplicate names are answered once, as in Kafka."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.coordinator.group.api import DeleteGroupResult
from exactly.protocol.apis import ApiKey, build
from exactly.server.authz import DELETE, GROUP, authorize
from exactly.server.clock import now_ms

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.DELETE_GROUPS


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    runtime = broker.groups
    names = list(dict.fromkeys(request.groups_names))
    results: list[DeleteGroupResult]
    refused = {
        g: ErrorCode.group_authorization_failed for g in names if not authorize(broker, ctx, DELETE, GROUP, g)
    }
    refused.update(
        (g, code)
        for g in names
        if g not in refused and (code := runtime.load_error_for(g)) is not ErrorCode.none
    )
    ours = [g for g in names if g not in refused]
    deleted: dict[str, DeleteGroupResult] = {}
    if ours:
        coordinator = runtime.coordinator
        answer = await runtime.call(lambda token: coordinator.delete_groups(ours, now_ms(), token))
        deleted = {r.group_id: r for r in answer}
    results = [deleted[g] if g in deleted else DeleteGroupResult(g, refused[g]) for g in names]
    mod = ctx.api.response_module
    for r in results:
        broker.metrics.error(API_KEY, r.error_code)
    return build(
        ctx.api.response_type,
        results=tuple(
            build(mod.DeletableGroupResult, group_id=r.group_id, error_code=r.error_code) for r in results
        ),
    )
