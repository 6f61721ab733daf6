"""DeleteAcls (31) v1-v3: remove the bindings each filter matches; answers what was removed.

Needs ALTER on the cluster (else every filter result is CLUSTER_AUTHORIZATION_FAILED);
SECURITY_DISABLED without an authorizer; a filter with an UNKNOWN code is INVALID_REQUEST. The
remaining filters are applied together and the new set persisted before the answer.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import ApiKey, build
from exactly.security.acl import AclBinding, AclBindingFilter, filter_from_wire
from exactly.server.authz import ALTER, authorize_cluster

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.DELETE_ACLS

log = logging.getLogger("exactly.acls")


def _filter(f: Any) -> AclBindingFilter | str:
    try:
        flt = filter_from_wire(
            f.resource_type_filter,
            f.resource_name_filter,
            getattr(f, "pattern_type_filter", 3),
            f.principal_filter,
            f.host_filter,
            f.operation,
            f.permission_type,
        )
    except ValueError as exc:
        return str(exc)
    return flt.error() or flt


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    mod = ctx.api.response_module
    store = broker.acls
    outcomes: list[tuple[ErrorCode, str | None, list[AclBinding]]] = []
    if store is None:
        outcomes = [
            (ErrorCode.security_disabled, "No Authorizer is configured.", []) for _ in request.filters
        ]
    elif not authorize_cluster(broker, ctx, ALTER):
        outcomes = [
            (ErrorCode.cluster_authorization_failed, "Cluster authorization failed.", [])
            for _ in request.filters
        ]
    else:
        parsed = [_filter(f) for f in request.filters]
        filters = [p for p in parsed if isinstance(p, AclBindingFilter)]
        try:  # fsync or ZooKeeper: off the event loop
            deleted = iter(await asyncio.get_running_loop().run_in_executor(None, store.remove, filters))
        except Exception as exc:  # the store's I/O failed (disk, ZooKeeper): nothing changed
            log.error("could not persist ACLs: %s: %s", type(exc).__name__, exc)
            deleted = iter([])
            parsed = ["could not persist the ACLs" for _ in parsed]
        for p in parsed:
            if isinstance(p, str):
                code = (
                    ErrorCode.invalid_request
                    if p != "could not persist the ACLs"
                    else ErrorCode.unknown_server_error
                )
                outcomes.append((code, p, []))
            else:
                gone = next(deleted)
                for b in gone:
                    log.info("ACL removed by %s: %s", ctx.principal, b)
                outcomes.append((ErrorCode.none, None, gone))
    for code, _m, _g in outcomes:
        broker.metrics.error(API_KEY, code)
    return build(
        ctx.api.response_type,
        filter_results=tuple(
            build(
                mod.DeleteAclsFilterResult,
                error_code=code,
                error_message=message,
                matching_acls=tuple(
                    build(
                        mod.DeleteAclsMatchingAcl,
                        error_code=ErrorCode.none,
                        error_message=None,
                        resource_type=b.pattern.resource_type,
                        resource_name=b.pattern.name,
                        pattern_type=b.pattern.pattern_type,
                        principal=b.entry.principal,
                        host=b.entry.host,
                        operation=b.entry.operation,
                        permission_type=b.entry.permission,
                    )
                    for b in gone
                ),
            )
            for code, message, gone in outcomes
        ),
    )
