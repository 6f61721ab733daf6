"""DescribeCluster (60): this broker is the whole cluster and its controller."""

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
    adv = broker.advertised
    assert adv is not None
    return build(
        ctx.api.response_type,
        error_code=ErrorCode.none,
        endpoint_type=getattr(request, "endpoint_type", 1),
        cluster_id=broker.cluster_id,
        controller_id=broker.node_id,
        brokers=(
            build(
                mod.DescribeClusterBroker, broker_id=broker.node_id, host=adv.host, port=adv.port, rack=None
            ),
        ),
        cluster_authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
    )
