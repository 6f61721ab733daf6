"""InitProducerId (22): producer ids for idempotent and transactional producers.

Without a transactional.id Kafka "blindly accepts" the request: a fresh producer id from the
persistent block allocator, epoch 0, whatever producer id/epoch (KIP-360) the client sent. With one,
the transaction coordinator maps the id to its producer id, aborts an open transaction of the
previous incarnation and bumps the epoch, which fences zombies. v6 adds KIP-939's ``enable_2pc``
and ``keep_prepared_txn`` (see ``TransactionCoordinator.init_producer_id``) and answers the kept
transaction's producer id and epoch in ``ongoing_txn_producer_id``/``ongoing_txn_producer_epoch``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import ApiKey, build
from exactly.server.authz import (
    IDEMPOTENT_WRITE,
    TWO_PHASE_COMMIT,
    TXN_ID,
    WRITE,
    authorize,
    authorize_any_topic,
    authorize_cluster,
)
from exactly.server.clock import now_ms

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.INIT_PRODUCER_ID


def _authorized(broker: Broker, ctx: RequestContext, tid: str | None, enable_2pc: bool) -> ErrorCode:
    """Kafka: WRITE on the transactional id, and TWO_PHASE_COMMIT on it too when the producer
    asks for two-phase commit (KIP-939); an idempotent producer needs IDEMPOTENT_WRITE on the
    cluster or WRITE on some topic (KIP-679)."""
    if tid is not None:
        if authorize(broker, ctx, WRITE, TXN_ID, tid) and (
            not enable_2pc or authorize(broker, ctx, TWO_PHASE_COMMIT, TXN_ID, tid)
        ):
            return ErrorCode.none
        return ErrorCode.transactional_id_authorization_failed
    if authorize_cluster(broker, ctx, IDEMPOTENT_WRITE, log_denied=False) or authorize_any_topic(
        broker, ctx, WRITE
    ):
        return ErrorCode.none
    return ErrorCode.cluster_authorization_failed


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    tid = request.transactional_id or None
    enable_2pc = bool(getattr(request, "enable2_pc", False))
    if (denied := _authorized(broker, ctx, tid, enable_2pc)) is not ErrorCode.none:
        broker.metrics.error(API_KEY, denied)
        return build(ctx.api.response_type, error_code=denied, producer_id=-1, producer_epoch=-1)
    if tid is not None and (error := broker.txn.owner_error(tid)) is not ErrorCode.none:
        broker.metrics.error(API_KEY, error)
        return build(ctx.api.response_type, error_code=error, producer_id=-1, producer_epoch=-1)
    coord = broker.txn.coordinator
    try:
        result = await broker.txn.execute(
            lambda: coord.init_producer_id(
                tid,
                int(request.transaction_timeout.total_seconds() * 1000),
                now_ms=now_ms(),
                producer_id=getattr(request, "producer_id", -1),
                producer_epoch=getattr(request, "producer_epoch", -1),
                request_version=ctx.version,
                enable_2pc=enable_2pc,
                keep_prepared_txn=bool(getattr(request, "keep_prepared_txn", False)),
            )
        )
    except OSError:
        result = None
    if result is None:
        broker.metrics.error(API_KEY, ErrorCode.kafka_storage_error)
        return build(
            ctx.api.response_type, error_code=ErrorCode.kafka_storage_error, producer_id=-1, producer_epoch=-1
        )
    broker.metrics.error(API_KEY, result.error)
    ongoing: dict[str, int] = {}
    if ctx.version >= 6:
        ongoing = {
            "ongoing_txn_producer_id": result.ongoing_txn_producer_id,
            "ongoing_txn_producer_epoch": result.ongoing_txn_producer_epoch,
        }
    return build(
        ctx.api.response_type,
        error_code=result.error,
        producer_id=result.producer_id,
        producer_epoch=result.producer_epoch,
        **ongoing,
    )
