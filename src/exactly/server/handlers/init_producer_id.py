"""InitProducerId (22), idempotent path: a fresh producer id from the persistent block
allocator, epoch 0.

Kafka's TransactionCoordinator "blindly accepts" a request without transactional.id and returns
a new producer id, whatever producer id/epoch (KIP-360) the client sent. Requests with a
transactional.id belong to the transaction coordinator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import ApiKey, build

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.connection import RequestContext

API_KEY = ApiKey.INIT_PRODUCER_ID


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    if request.transactional_id is not None:
        txn = getattr(broker, "txn_coordinator", None)
        if txn is None:
            broker.metrics.error(ApiKey.INIT_PRODUCER_ID, ErrorCode.coordinator_not_available)
            return build(
                ctx.api.response_type,
                error_code=ErrorCode.coordinator_not_available,
                producer_id=-1,
                producer_epoch=-1,
            )
        return await txn.handle_init_producer_id(ctx, request)
    try:
        producer_id = broker.producer_ids.generate()
    except OSError:
        broker.metrics.error(ApiKey.INIT_PRODUCER_ID, ErrorCode.kafka_storage_error)
        return build(
            ctx.api.response_type, error_code=ErrorCode.kafka_storage_error, producer_id=-1, producer_epoch=-1
        )
    return build(ctx.api.response_type, error_code=ErrorCode.none, producer_id=producer_id, producer_epoch=0)
