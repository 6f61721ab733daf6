"""CreateAcls (30) v1-v3: add ACL bindings; they apply to the next request, without a restart.

Kafka's AclApis: ALTER on the cluster is required (else every creation gets
CLUSTER_AUTHORIZATION_FAILED); without an authorizer every creation gets SECURITY_DISABLED; a
binding that cannot be stored (an UNKNOWN/ANY code, a Cluster resource not named
``kafka-cluster``, an empty name, a malformed principal) gets INVALID_REQUEST. The valid ones are
persisted together (exactly.security.acl_store) before the answer.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import ApiKey, build
from exactly.security.acl import AclBinding, binding, binding_error
from exactly.server.authz import ALTER, authorize_cluster

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.CREATE_ACLS

log = logging.getLogger("exactly.acls")


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    mod = ctx.api.response_module
    store = broker.acls
    outcomes: list[tuple[ErrorCode, str | None]] = []
    valid: list[AclBinding] = []
    for c in request.creations:
        if store is None:
            outcomes.append((ErrorCode.security_disabled, "No Authorizer is configured."))
            continue
        if not authorize_cluster(broker, ctx, ALTER):
            outcomes.append((ErrorCode.cluster_authorization_failed, "Cluster authorization failed."))
            continue
        try:
            b = binding(
                c.resource_type,
                c.resource_name,
                getattr(c, "resource_pattern_type", 3),
                c.principal,
                c.host,
                c.operation,
                c.permission_type,
            )
            problem = binding_error(b)
        except ValueError as exc:
            problem = str(exc)
        if problem is not None:
            outcomes.append((ErrorCode.invalid_request, problem))
            continue
        valid.append(b)
        outcomes.append((ErrorCode.none, None))
    if valid and store is not None:
        try:  # fsync or ZooKeeper: off the event loop
            await asyncio.get_running_loop().run_in_executor(None, store.add, valid)
        except Exception as exc:  # the store's I/O failed (disk, ZooKeeper): nothing changed
            log.error("could not persist ACLs: %s: %s", type(exc).__name__, exc)
            outcomes = [
                (ErrorCode.unknown_server_error, "could not persist the ACLs")
                if code is ErrorCode.none
                else (code, m)
                for code, m in outcomes
            ]
        else:
            for b in valid:
                log.info("ACL added by %s: %s", ctx.principal, b)
    for code, _ in outcomes:
        broker.metrics.error(API_KEY, code)
    return build(
        ctx.api.response_type,
        results=tuple(build(mod.AclCreationResult, error_code=code, error_message=m) for code, m in outcomes),
    )
