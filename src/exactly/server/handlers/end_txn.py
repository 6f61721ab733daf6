"""EndTxn (26): commit or abort. PrepareCommit/PrepareAbort is persisted, the markers are written
to every partition of the transaction (and the group's pending offsets committed or dropped),
then CompleteCommit/CompleteAbort is persisted; see server.txn_runtime."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from exactly.protocol.apis import ApiKey, build
from exactly.server.clock import now_ms

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.END_TXN


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    step = broker.txn.coordinator.end_txn(
        request.transactional_id,
        request.producer_id,
        request.producer_epoch,
        request.committed,
        now_ms=now_ms(),
        request_version=ctx.version,
    )
    result = broker.txn.drive(step)
    broker.metrics.error(API_KEY, result.error)
    return build(
        ctx.api.response_type,
        error_code=result.error,
        producer_id=result.producer_id,
        producer_epoch=result.producer_epoch,
    )
