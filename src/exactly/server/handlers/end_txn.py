"""EndTxn (26): commit or abort. PrepareCommit/PrepareAbort is persisted, the markers are written
to every partition of the transaction (and the group's pending offsets committed or dropped),
then CompleteCommit/CompleteAbort is persisted; see server.txn_runtime. In cluster mode only the
leader of the id's ``__transaction_state`` partition answers (else NOT_COORDINATOR)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import ApiKey, build
from exactly.server.authz import TXN_ID, WRITE, authorize
from exactly.server.clock import now_ms

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.END_TXN


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    if not authorize(broker, ctx, WRITE, TXN_ID, request.transactional_id):
        error = ErrorCode.transactional_id_authorization_failed
    else:
        error = broker.txn.owner_error(request.transactional_id)
    if error is not ErrorCode.none:
        broker.metrics.error(API_KEY, error)
        return build(ctx.api.response_type, error_code=error, producer_id=-1, producer_epoch=-1)
    coord = broker.txn.coordinator
    result = await broker.txn.execute(
        lambda: coord.end_txn(
            request.transactional_id,
            request.producer_id,
            request.producer_epoch,
            request.committed,
            now_ms=now_ms(),
            request_version=ctx.version,
        )
    )
    broker.metrics.error(API_KEY, result.error)
    return build(
        ctx.api.response_type,
        error_code=result.error,
        producer_id=result.producer_id,
        producer_epoch=result.producer_epoch,
    )
