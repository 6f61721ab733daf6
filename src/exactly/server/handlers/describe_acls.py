"""DescribeAcls (29) v1-v3: the bindings matching one filter, grouped by resource pattern.

Needs DESCRIBE on the cluster (else a top-level CLUSTER_AUTHORIZATION_FAILED); SECURITY_DISABLED
without an authorizer; a filter with an UNKNOWN code is INVALID_REQUEST (Kafka's AclApis).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import ApiKey, build
from exactly.security.acl import AclBinding, ResourcePattern, filter_from_wire
from exactly.server.authz import DESCRIBE, authorize_cluster

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.DESCRIBE_ACLS


def _error(ctx: RequestContext, broker: Broker, code: ErrorCode, message: str) -> Any:
    broker.metrics.error(API_KEY, code)
    return build(ctx.api.response_type, error_code=code, error_message=message, resources=())


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    mod = ctx.api.response_module
    if broker.acls is None:
        return _error(ctx, broker, ErrorCode.security_disabled, "No Authorizer is configured.")
    if not authorize_cluster(broker, ctx, DESCRIBE):
        return _error(ctx, broker, ErrorCode.cluster_authorization_failed, "Cluster authorization failed.")
    try:
        flt = filter_from_wire(
            request.resource_type_filter,
            request.resource_name_filter,
            getattr(request, "pattern_type_filter", 3),
            request.principal_filter,
            request.host_filter,
            request.operation,
            request.permission_type,
        )
        problem = flt.error()
    except ValueError as exc:
        problem = str(exc)
    if problem is not None:
        return _error(ctx, broker, ErrorCode.invalid_request, problem)
    grouped: dict[ResourcePattern, list[AclBinding]] = {}
    for b in broker.acls.describe(flt):
        grouped.setdefault(b.pattern, []).append(b)
    return build(
        ctx.api.response_type,
        error_code=ErrorCode.none,
        error_message=None,
        resources=tuple(
            build(
                mod.DescribeAclsResource,
                resource_type=p.resource_type,
                resource_name=p.name,
                pattern_type=p.pattern_type,
                acls=tuple(
                    build(
                        mod.AclDescription,
                        principal=b.entry.principal,
                        host=b.entry.host,
                        operation=b.entry.operation,
                        permission_type=b.entry.permission,
                    )
                    for b in found
                ),
            )
            for p, found in grouped.items()
        ),
    )
