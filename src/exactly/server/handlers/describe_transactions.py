"""DescribeTransactions (65, KIP-664): state, producer, timeout, start time and partitions."""

from __future__ import annotations

import datetime
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import ApiKey, build
from exactly.server.authz import DESCRIBE, TOPIC, TXN_ID, authorize

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.DESCRIBE_TRANSACTIONS


def ms_to_datetime(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    mod = ctx.api.response_module
    states = []
    for d in broker.txn.coordinator.describe_transactions(request.transactional_ids):
        # a cluster broker that does not lead the id's partition answers NOT_COORDINATOR
        if not authorize(broker, ctx, DESCRIBE, TXN_ID, d.transactional_id):
            error = ErrorCode.transactional_id_authorization_failed
        else:
            error = broker.txn.owner_error(d.transactional_id) or d.error
        if error:
            # Kafka sets only the error code and the id; every other field keeps its schema
            # default (0, "", empty), not the -1 "no producer" values
            states.append(
                build(
                    mod.TransactionState,
                    error_code=error,
                    transactional_id=d.transactional_id,
                    transaction_start_time=ms_to_datetime(0),
                )
            )
            continue
        by_topic: dict[str, list[int]] = defaultdict(list)
        for tp in d.partitions:
            # Kafka strips the topics the caller may not describe from the answer
            if not authorize(broker, ctx, DESCRIBE, TOPIC, tp.topic, log_denied=False):
                continue
            by_topic[tp.topic].append(tp.partition)
        states.append(
            build(
                mod.TransactionState,
                error_code=d.error,
                transactional_id=d.transactional_id,
                transaction_state=d.state,
                transaction_timeout=datetime.timedelta(milliseconds=d.transaction_timeout_ms),
                transaction_start_time=ms_to_datetime(d.transaction_start_time_ms),
                producer_id=d.producer_id,
                producer_epoch=d.producer_epoch,
                topics=tuple(
                    build(mod.TopicData, topic=t, partitions=tuple(sorted(ps)))
                    for t, ps in sorted(by_topic.items())
                ),
            )
        )
    return build(ctx.api.response_type, transaction_states=tuple(states))
