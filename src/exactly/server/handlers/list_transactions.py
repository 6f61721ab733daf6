"""ListTransactions (66, KIP-664; v1 duration filter KIP-994)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from exactly.protocol.apis import ApiKey, build
from exactly.server.authz import DESCRIBE, TXN_ID, authorize
from exactly.server.clock import now_ms

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.LIST_TRANSACTIONS


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    mod = ctx.api.response_module
    result = broker.txn.coordinator.list_transactions(
        now_ms=now_ms(),
        state_filters=request.state_filters,
        producer_id_filters=request.producer_id_filters,
        duration_filter_ms=getattr(request, "duration_filter", -1),
    )
    broker.metrics.error(API_KEY, result.error)
    return build(
        ctx.api.response_type,
        error_code=result.error,
        unknown_state_filters=result.unknown_state_filters,
        transaction_states=tuple(
            build(
                mod.TransactionState,
                transactional_id=t.transactional_id,
                producer_id=t.producer_id,
                transaction_state=t.state,
            )
            for t in result.transactions
            # Kafka filters silently by DESCRIBE on each transactional id
            if authorize(broker, ctx, DESCRIBE, TXN_ID, t.transactional_id, log_denied=False)
        ),
    )
