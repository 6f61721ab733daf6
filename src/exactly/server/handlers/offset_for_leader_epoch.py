"""OffsetsForLeaderEpoch (23), v2-v4: where a leader epoch ends in this broker's log (KIP-101).

A follower that starts following a new leader epoch asks its leader where the follower's latest
epoch ends there, then truncates its own log to that point (``replication.truncation``).
Consumers ask it too (KIP-320): after every leader change they check that the epoch of their
position still ends at or after it on the new leader, and move back to that end otherwise (a
truncated tail) instead of fetching on from a position the new leader never had. librdkafka sends
only v2 (no replica id: a consumer) and, when the broker does not offer it, silently skips that
check; Kafka offers v0-v4, kio has no schemas for v0-v1, which only pre-2.1 clients send. The
answer is Kafka's ``endOffsetFor`` (``storage.leader_epoch.end_offset_for``): the largest
epoch <= the one asked and the start offset of the next epoch (the log end for the current
epoch), or (-1, -1) when the epoch is newer than anything known.

Checks per partition, as Kafka's ``Partition.lastOffsetForLeaderEpoch``: the current leader epoch
the sender believes (FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH), then leadership
(NOT_LEADER_OR_FOLLOWER; Kafka lets a follower answer consumers' requests with replica_id -2,
which is not supported here). On a single broker (no cluster) the broker leads everything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import ApiKey, build
from exactly.replication.fetch_checks import check_current_leader_epoch
from exactly.server.authz import CLUSTER_ACTION, DESCRIBE, TOPIC, authorize, authorize_cluster
from exactly.types import TopicPartition

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.OFFSET_FOR_LEADER_EPOCH


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    mod = ctx.api.response_module
    topics = []
    # Kafka: CLUSTER_ACTION (a follower), else DESCRIBE on each topic (a consumer, KIP-320)
    cluster = authorize_cluster(broker, ctx, CLUSTER_ACTION, log_denied=False)
    for topic in request.topics:
        parts = []
        allowed = cluster or authorize(broker, ctx, DESCRIBE, TOPIC, str(topic.topic))
        for p in topic.partitions:
            tp = TopicPartition(str(topic.topic), int(p.partition))
            if allowed:
                code, epoch, end = _answer(broker, tp, int(p.current_leader_epoch), int(p.leader_epoch))
            else:
                code, epoch, end = ErrorCode.topic_authorization_failed, -1, -1
            if code != ErrorCode.none:
                broker.metrics.error(ApiKey.OFFSET_FOR_LEADER_EPOCH, code)
            parts.append(
                build(
                    mod.EpochEndOffset,
                    error_code=code,
                    partition=p.partition,
                    leader_epoch=epoch,
                    end_offset=end,
                )
            )
        topics.append(build(mod.OffsetForLeaderTopicResult, topic=topic.topic, partitions=tuple(parts)))
    return build(ctx.api.response_type, topics=tuple(topics))


def _answer(
    broker: Broker, tp: TopicPartition, current_epoch: int, asked_epoch: int
) -> tuple[ErrorCode, int, int]:
    plog = broker.logs.get_partition(tp)
    replicas = broker.replicas
    if replicas is not None and replicas.manages(tp):
        code = replicas.check_read(tp, current_epoch)
        if code != ErrorCode.none:
            return code, -1, -1
    elif plog is not None:
        # Single broker: it leads every partition at its latest epoch.
        code = check_current_leader_epoch(current_epoch, max(plog.leader_epochs.latest_epoch, 0))
        if code != ErrorCode.none:
            return code, -1, -1
    if plog is None:
        return ErrorCode.unknown_topic_or_partition, -1, -1
    answer = plog.leader_epochs.end_offset_for(asked_epoch, plog.log_end_offset)
    return ErrorCode.none, answer.leader_epoch, answer.end_offset
