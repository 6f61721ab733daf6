"""DescribeUserScramCredentials (50, KIP-554): per user, the mechanisms and iteration counts of
its SCRAM credentials, never a salt or a key.

Null or empty ``users``: every user that has a credential. Named users: RESOURCE_NOT_FOUND for one
without any, DUPLICATE_RESOURCE for a name asked twice (as Kafka's ZkAdminManager). Needs DESCRIBE on the
Cluster, else a top-level CLUSTER_AUTHORIZATION_FAILED."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import ApiKey, build
from exactly.server.authz import DESCRIBE, authorize_cluster

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    mod = ctx.api.response_module
    if not authorize_cluster(broker, ctx, DESCRIBE):
        broker.metrics.error(API_KEY, ErrorCode.cluster_authorization_failed)
        return build(
            ctx.api.response_type,
            error_code=ErrorCode.cluster_authorization_failed,
            error_message="Cluster authorization failed.",
            results=(),
        )
    users = broker.credentials.users()
    names = sorted(users) if not request.users else [u.name for u in request.users]
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    results = []
    seen: set[str] = set()
    for name in names:
        if name in seen:
            continue
        seen.add(name)
        error, message = ErrorCode.none, ""  # Kafka's default, not null
        infos: tuple[Any, ...] = ()
        if counts[name] > 1:
            error, message = (
                ErrorCode.duplicate_resource,
                f"Cannot describe SCRAM credentials for the same user twice in a single request: {name}",
            )
        elif name not in users:
            error, message = (
                ErrorCode.resource_not_found,
                f"Attempt to describe a user credential that does not exist: {name}",
            )
        else:
            infos = tuple(
                build(mod.CredentialInfo, mechanism=m.type_id, iterations=c.iterations)
                for m, c in sorted(users[name].items(), key=lambda kv: kv[0].type_id)
            )
        broker.metrics.error(API_KEY, error)
        results.append(
            build(
                mod.DescribeUserScramCredentialsResult,
                user=name,
                error_code=error,
                error_message=message,
                credential_infos=infos,
            )
        )
    return build(ctx.api.response_type, error_code=ErrorCode.none, results=tuple(results))
