"""The handlers' side of authorization: ask the broker's authorizer, count and audit-log denials.

With no authorizer configured (``authorizer.class.name`` empty, the default) every check allows,
as Kafka's AuthHelper does. Otherwise a check asks ``exactly.security.authorizer.Authorizer`` with
the request's principal (``RequestContext.principal``: ``User:ANONYMOUS`` on an unauthenticated
listener) and the peer's IP, and a denial is

* counted in ``Metrics.authorization_denied`` by (resource type, operation), exported as
  ``exactly_authorization_denied_total{resource_type,operation}``;
* logged on ``exactly.audit`` (principal, host, operation, resource, API), like Kafka's
  ``kafka.authorizer.logger``. Requests carry no credentials, so none can leak into the line.

``log_denied=False`` is for filtering checks whose failures Kafka does not audit (a Metadata
request for all topics silently omits what the caller may not describe); they are not counted
either, as nothing was refused.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from exactly.protocol.apis import ApiKey
from exactly.security.acl import CLUSTER_NAME, AclOperation, ResourceType

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

audit = logging.getLogger("exactly.audit")

TOPIC = ResourceType.TOPIC
GROUP = ResourceType.GROUP
CLUSTER = ResourceType.CLUSTER
TXN_ID = ResourceType.TRANSACTIONAL_ID

READ = AclOperation.READ
WRITE = AclOperation.WRITE
CREATE = AclOperation.CREATE
DELETE = AclOperation.DELETE
ALTER = AclOperation.ALTER
DESCRIBE = AclOperation.DESCRIBE
CLUSTER_ACTION = AclOperation.CLUSTER_ACTION
DESCRIBE_CONFIGS = AclOperation.DESCRIBE_CONFIGS
ALTER_CONFIGS = AclOperation.ALTER_CONFIGS
IDEMPOTENT_WRITE = AclOperation.IDEMPOTENT_WRITE
TWO_PHASE_COMMIT = AclOperation.TWO_PHASE_COMMIT


def peer_host(peer: str) -> str:
    """The IP of ``host:port`` (IPv6 ``a:b::c:port`` too): what an ACL's host is matched to."""
    host, sep, _port = peer.rpartition(":")
    return host.strip("[]") if sep else peer


def authorize(
    broker: Broker,
    ctx: RequestContext,
    op: AclOperation,
    rtype: ResourceType,
    name: str,
    *,
    log_denied: bool = True,
) -> bool:
    authorizer = broker.authorizer
    if authorizer is None:
        return True
    host = peer_host(ctx.peer)
    if authorizer.authorize(ctx.principal, host, op, rtype, name):
        if audit.isEnabledFor(logging.DEBUG):
            audit.debug(_line("ALLOWED", ctx, host, op, rtype, name))
        return True
    if log_denied:
        broker.metrics.authorization_denied[(rtype.name, op.name)] += 1
        audit.info(_line("DENIED", ctx, host, op, rtype, name))
    return False


def authorize_cluster(
    broker: Broker, ctx: RequestContext, op: AclOperation, *, log_denied: bool = True
) -> bool:
    return authorize(broker, ctx, op, CLUSTER, CLUSTER_NAME, log_denied=log_denied)


def authorize_any_topic(broker: Broker, ctx: RequestContext, op: AclOperation) -> bool:
    """KIP-679: may the caller do ``op`` on some topic (idempotent InitProducerId)?"""
    authorizer = broker.authorizer
    if authorizer is None:
        return True
    host = peer_host(ctx.peer)
    if authorizer.authorize_by_resource_type(ctx.principal, host, op, TOPIC):
        return True
    broker.metrics.authorization_denied[(TOPIC.name, op.name)] += 1
    audit.info(_line("DENIED", ctx, host, op, TOPIC, "<any>"))
    return False


def _line(
    result: str, ctx: RequestContext, host: str, op: AclOperation, rtype: ResourceType, name: str
) -> str:
    try:
        api = ApiKey(ctx.header.api_key).name
    except ValueError:
        api = str(ctx.header.api_key)
    return (
        f"{result} principal={ctx.principal} host={host} operation={op.name} "
        f"resource={rtype.name}:{name!r} api={api} correlation_id={ctx.header.correlation_id}"
    )
