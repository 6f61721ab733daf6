"""WriteTxnMarkers (27): write COMMIT/ABORT markers to partitions of this broker.

Kafka's coordinator sends this to partition leaders; admin tools send it to abort a hung
transaction (KIP-664: ``kafka-transactions.sh abort``). Each marker goes through the partition's
producer state, so a marker from an older coordinator epoch is refused
(TRANSACTION_COORDINATOR_FENCED) and one for a stale producer epoch too (INVALID_PRODUCER_EPOCH).
In cluster mode only the partition's leader appends, acknowledged by the ISR
(``txn_marker_sender.write_local_marker``; NOT_LEADER_OR_FOLLOWER elsewhere).

A marker without a producer (a negative producer id or epoch) gets INVALID_REQUEST on each of its
partitions and writes nothing. Deliberately stricter than Kafka, which appends such a marker as a
control batch that no producer state tracks: only a broken or hostile peer sends one, and a marker
that decides no transaction has no business in the log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import ApiKey, build
from exactly.records.control import ControlType
from exactly.server.authz import ALTER, CLUSTER_ACTION, authorize_cluster
from exactly.server.internal_topics import AppendFailed
from exactly.server.txn_marker_sender import write_local_marker
from exactly.topics import CONSUMER_OFFSETS_TOPIC
from exactly.types import TopicPartition

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.WRITE_TXN_MARKERS


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    mod = ctx.api.response_module
    # Kafka: ALTER or CLUSTER_ACTION on the cluster, else every partition gets
    # CLUSTER_AUTHORIZATION_FAILED (an admin's abort needs ALTER, a coordinator CLUSTER_ACTION)
    allowed = authorize_cluster(broker, ctx, ALTER, log_denied=False) or authorize_cluster(
        broker, ctx, CLUSTER_ACTION
    )
    results = []
    for marker in request.markers:
        refused = None
        if not allowed:
            refused = ErrorCode.cluster_authorization_failed
        elif marker.producer_id < 0 or marker.producer_epoch < 0:
            refused = ErrorCode.invalid_request
        if refused is not None:
            code = refused
            results.append(
                build(
                    mod.WritableTxnMarkerResult,
                    producer_id=marker.producer_id,
                    topics=tuple(
                        build(
                            mod.WritableTxnMarkerTopicResult,
                            name=t.name,
                            partitions=tuple(
                                build(
                                    mod.WritableTxnMarkerPartitionResult, partition_index=p, error_code=code
                                )
                                for p in t.partition_indexes
                            ),
                        )
                        for t in marker.topics
                    ),
                )
            )
            broker.metrics.error(API_KEY, code)
            continue
        result = ControlType.COMMIT if marker.transaction_result else ControlType.ABORT
        topics = []
        for topic in marker.topics:
            parts = []
            for p in topic.partition_indexes:
                tp = TopicPartition(topic.name, p)
                code = ErrorCode.none
                if broker.replicas is not None:  # cluster: as the leader, acks=all
                    code = await write_local_marker(
                        broker,
                        tp,
                        result,
                        marker.producer_id,
                        marker.producer_epoch,
                        marker.coordinator_epoch,
                    )
                    broker.metrics.error(API_KEY, code)
                    parts.append(
                        build(mod.WritableTxnMarkerPartitionResult, partition_index=p, error_code=code)
                    )
                    continue
                try:
                    if not broker.internal.write_marker(
                        tp, result, marker.producer_id, marker.producer_epoch, marker.coordinator_epoch
                    ):
                        code = ErrorCode.unknown_topic_or_partition
                    elif tp.topic == CONSUMER_OFFSETS_TOPIC:
                        broker.groups.on_marker(p, marker.producer_id, result is ControlType.COMMIT)
                except AppendFailed as exc:
                    code = exc.error_code
                broker.metrics.error(API_KEY, code)
                parts.append(build(mod.WritableTxnMarkerPartitionResult, partition_index=p, error_code=code))
            topics.append(build(mod.WritableTxnMarkerTopicResult, name=topic.name, partitions=tuple(parts)))
        results.append(
            build(mod.WritableTxnMarkerResult, producer_id=marker.producer_id, topics=tuple(topics))
        )
    return build(ctx.api.response_type, markers=tuple(results))
