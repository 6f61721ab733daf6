"""DescribeCluster (60): the brokers and the controller.

Single broker: this broker is the whole cluster and its controller. Cluster mode: the live brokers
and the controller from the metadata cache (the same view Metadata answers from; -1 while no
controller is known), as Kafka answers from its metadata cache.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import ApiKey, build

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.DESCRIBE_CLUSTER

AUTHORIZED_OPERATIONS_OMITTED = -(2**31)


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    mod = ctx.api.response_module
    adv = broker.advertised_for(ctx.listener) or broker.advertised
    assert adv is not None
    if broker.replicas is None:
        endpoints = [(broker.node_id, adv.host, adv.port)]
        controller = broker.node_id
    else:
        cache = broker.replicas.cache
        endpoints = [
            (b.broker_id, *ep)
            for _, b in sorted(cache.brokers.items())
            if (ep := b.endpoint_for(ctx.listener)) is not None
        ]
        controller = cache.controller_id if cache.controller_id is not None else -1
    return build(
        ctx.api.response_type,
        error_code=ErrorCode.none,
        endpoint_type=getattr(request, "endpoint_type", 1),
        cluster_id=broker.cluster_id,
        controller_id=controller,
        brokers=tuple(
            build(mod.DescribeClusterBroker, broker_id=node, host=host, port=port, rack=None)
            for node, host, port in endpoints
        ),
        cluster_authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
    )
