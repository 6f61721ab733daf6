"""AddOffsetsToTxn (25): the transaction will commit offsets of ``group_id``; its
``__consumer_offsets`` partition joins the transaction so the EndTxn marker reaches it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import ApiKey, build
from exactly.server.authz import GROUP, READ, TXN_ID, WRITE, authorize
from exactly.server.clock import now_ms
from exactly.topics import CONSUMER_OFFSETS_TOPIC

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.ADD_OFFSETS_TO_TXN


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    if not authorize(broker, ctx, WRITE, TXN_ID, request.transactional_id):
        error = ErrorCode.transactional_id_authorization_failed
    elif not authorize(broker, ctx, READ, GROUP, request.group_id):
        error = ErrorCode.group_authorization_failed
    else:
        error = broker.txn.owner_error(request.transactional_id)
    if error is not ErrorCode.none:
        broker.metrics.error(API_KEY, error)
        return build(ctx.api.response_type, error_code=error)
    broker.internal.request(CONSUMER_OFFSETS_TOPIC)
    coord = broker.txn.coordinator
    result = await broker.txn.execute(
        lambda: coord.add_offsets_to_txn(
            request.transactional_id,
            request.producer_id,
            request.producer_epoch,
            request.group_id,
            now_ms=now_ms(),
            request_version=ctx.version,
        )
    )
    broker.metrics.error(API_KEY, result.error)
    return build(ctx.api.response_type, error_code=result.error)
