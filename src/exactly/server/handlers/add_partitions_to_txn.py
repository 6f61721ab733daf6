"""AddPartitionsToTxn (24): a transactional producer announces the partitions it will write.

v0-v3 come from clients: one transaction. Unknown topics fail with UNKNOWN_TOPIC_OR_PARTITION and
the other partitions of the request with OPERATION_NOT_ATTEMPTED, without touching the
transaction (as Kafka). v4+ (KIP-890) come from partition leaders: a batch of transactions, each
either added or, with ``verify_only``, checked.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import ApiKey, build
from exactly.server.authz import CLUSTER_ACTION, TOPIC, TXN_ID, WRITE, authorize, authorize_cluster
from exactly.server.clock import now_ms
from exactly.types import TopicPartition

if TYPE_CHECKING:
    from exactly.coordinator.txn.effects import AddPartitionsResult
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.ADD_PARTITIONS_TO_TXN


def _exists(broker: Broker, tp: TopicPartition) -> bool:
    """A partition of the cluster (its leader may be another broker), or a local one."""
    if broker.replicas is not None:
        cached = broker.replicas.cache.topic(tp.topic)
        return cached is not None and tp.partition in cached.assignment.partitions
    return broker.partition(tp.topic, tp.partition) is not None


def _partitions(
    broker: Broker, topics: Iterable[Any]
) -> tuple[list[TopicPartition], dict[TopicPartition, ErrorCode]]:
    wanted: list[TopicPartition] = []
    unknown: dict[TopicPartition, ErrorCode] = {}
    for topic in topics:
        for p in topic.partitions:
            tp = TopicPartition(topic.name, p)
            wanted.append(tp)
            if not _exists(broker, tp):
                unknown[tp] = ErrorCode.unknown_topic_or_partition
    return wanted, unknown


async def _one(
    broker: Broker, ctx: RequestContext, tid: str, pid: int, epoch: int, topics: Any, verify: bool
) -> dict[TopicPartition, ErrorCode]:
    wanted, unknown = _partitions(broker, topics)
    if ctx.version <= 3:  # a client's request (v4+ come from brokers, authorized in handle)
        if not authorize(broker, ctx, WRITE, TXN_ID, tid):
            return dict.fromkeys(wanted, ErrorCode.transactional_id_authorization_failed)
        # checked before existence: an unauthorized topic is never revealed to exist
        denied = {tp.topic for tp in wanted if not authorize(broker, ctx, WRITE, TOPIC, tp.topic)}
        if denied:
            return {
                tp: ErrorCode.topic_authorization_failed
                if tp.topic in denied
                else unknown.get(tp, ErrorCode.operation_not_attempted)
                for tp in wanted
            }
    if unknown:
        return {tp: unknown.get(tp, ErrorCode.operation_not_attempted) for tp in wanted}
    error = broker.txn.owner_error(tid)
    if error is not ErrorCode.none:  # cluster mode: another broker coordinates tid
        return dict.fromkeys(wanted, error)
    coord = broker.txn.coordinator
    result: AddPartitionsResult
    if verify:
        result = coord.verify_partitions_in_txn(tid, pid, epoch, wanted, request_version=ctx.version)
    else:
        result = await broker.txn.execute(
            lambda: coord.add_partitions_to_txn(
                tid, pid, epoch, wanted, now_ms=now_ms(), request_version=ctx.version
            )
        )
    return result.as_dict()


def _topic_results(mod: Any, errors: dict[TopicPartition, ErrorCode]) -> tuple[Any, ...]:
    by_topic: dict[str, list[Any]] = defaultdict(list)
    for tp, code in errors.items():
        by_topic[tp.topic].append(
            build(
                mod.AddPartitionsToTxnPartitionResult, partition_index=tp.partition, partition_error_code=code
            )
        )
    return tuple(
        build(mod.AddPartitionsToTxnTopicResult, name=name, results_by_partition=tuple(parts))
        for name, parts in by_topic.items()
    )


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    mod = ctx.api.response_module
    if ctx.version <= 3:
        errors = await _one(
            broker,
            ctx,
            request.v3_and_below_transactional_id,
            request.v3_and_below_producer_id,
            request.v3_and_below_producer_epoch,
            request.v3_and_below_topics,
            verify=False,
        )
        for code in errors.values():
            broker.metrics.error(API_KEY, code)
        return build(ctx.api.response_type, results_by_topic_v3_and_below=_topic_results(mod, errors))
    if not authorize_cluster(broker, ctx, CLUSTER_ACTION):  # v4+: broker to coordinator only
        broker.metrics.error(API_KEY, ErrorCode.cluster_authorization_failed)
        return build(ctx.api.response_type, error_code=ErrorCode.cluster_authorization_failed)
    results = []
    for txn in request.transactions:
        errors = await _one(
            broker,
            ctx,
            txn.transactional_id,
            txn.producer_id,
            txn.producer_epoch,
            txn.topics,
            txn.verify_only,
        )
        results.append(
            build(
                mod.AddPartitionsToTxnResult,
                transactional_id=txn.transactional_id,
                topic_results=_topic_results(mod, errors),
            )
        )
    return build(ctx.api.response_type, error_code=ErrorCode.none, results_by_transaction=tuple(results))
