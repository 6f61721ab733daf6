"""ListOffsets (2), v1+: earliest (-2), latest (-1: high watermark, or the last stable offset
under isolation_level=1) and by timestamp (first record with timestamp >= the target).

In a cluster only the leader answers, and (KIP-207) a client's ListOffsets gets the retriable
OFFSET_NOT_AVAILABLE while the leader's high watermark is below the offset its leader epoch
started at: a new leader's HW lags until its followers fetch again, and answering with it could
hand a consumer an offset below what the previous leader already reported (auto.offset.reset
and lag monitoring would see offsets go backwards). Versions before 5 get LEADER_NOT_AVAILABLE
instead, as Kafka answers them (their clients do not know code 78). Replica requests
(replica_id >= 0) are answered as before.

By timestamp: the time index finds the first batch whose max timestamp reaches the target; that
one batch is then decoded to find the exact record, as Kafka does. This is the only broker path
that decodes records, and it is not a hot path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import ApiKey, build
from exactly.records.builder import decode_batch
from exactly.types import TopicPartition

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext
    from exactly.storage.partition_log import PartitionLog

API_KEY = ApiKey.LIST_OFFSETS

LATEST = -1
EARLIEST = -2
READ_COMMITTED = 1
CONSUMER_REPLICA_ID = -1
OFFSET_NOT_AVAILABLE_SINCE = 5  # ListOffsets version that introduced the code (KIP-207)


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    mod = ctx.api.response_module
    committed = getattr(request, "isolation_level", 0) == READ_COMMITTED
    from_client = int(getattr(request, "replica_id", CONSUMER_REPLICA_ID)) == CONSUMER_REPLICA_ID
    topics = []
    for topic in request.topics:
        parts = []
        for p in topic.partitions:
            plog = broker.partition(topic.name, p.partition_index)
            code = ErrorCode.none if plog is not None else ErrorCode.unknown_topic_or_partition
            leader_epoch = 0
            replicas = broker.replicas
            tp = TopicPartition(topic.name, p.partition_index)
            if replicas is not None and replicas.manages(tp):
                # Cluster: only the leader answers, at the epoch the client believes (KIP-320).
                code = replicas.check_read(tp, getattr(p, "current_leader_epoch", -1))
                leader = replicas.leaders.get(tp)
                leader_epoch = leader.leader_epoch if leader is not None else -1
                if (
                    code == ErrorCode.none
                    and from_client
                    and leader is not None
                    and plog is not None
                    and plog.high_watermark < leader.epoch_start_offset
                ):
                    code = (
                        ErrorCode.offset_not_available
                        if ctx.version >= OFFSET_NOT_AVAILABLE_SINCE
                        else ErrorCode.leader_not_available
                    )
            if plog is None or code != ErrorCode.none:
                code = code if code != ErrorCode.none else ErrorCode.unknown_topic_or_partition
                broker.metrics.error(ApiKey.LIST_OFFSETS, code)
                parts.append(
                    build(
                        mod.ListOffsetsPartitionResponse,
                        partition_index=p.partition_index,
                        error_code=code,
                        timestamp=-1,
                        offset=-1,
                        leader_epoch=-1,
                    )
                )
                continue
            ts, offset = _lookup(plog, p.timestamp, committed)
            parts.append(
                build(
                    mod.ListOffsetsPartitionResponse,
                    partition_index=p.partition_index,
                    error_code=ErrorCode.none,
                    timestamp=ts,
                    offset=offset,
                    leader_epoch=leader_epoch,
                )
            )
        topics.append(build(mod.ListOffsetsTopicResponse, name=topic.name, partitions=tuple(parts)))
    return build(ctx.api.response_type, topics=tuple(topics))


def _lookup(plog: PartitionLog, timestamp: int, committed: bool) -> tuple[int, int]:
    if timestamp == EARLIEST:
        return -1, plog.log_start_offset
    if timestamp == LATEST:
        return -1, plog.last_stable_offset if committed else plog.high_watermark
    # Kafka's Partition.fetchOffsetForTimestamp: only offsets a consumer of this isolation level
    # may read count (below the LSO for read_committed, below the high watermark otherwise).
    limit = plog.last_stable_offset if committed else plog.high_watermark
    found = plog.offset_for_timestamp(timestamp)
    if found is None or found[0] >= limit:
        return -1, -1
    offset, batch_ts = found
    try:
        data = plog.read(offset, 1, read_committed=False, min_one_batch=True).records
        if data:
            _header, records = decode_batch(data)
            for rec in records:
                if rec.offset >= limit:
                    break
                if rec.offset >= offset and rec.timestamp is not None and rec.timestamp >= timestamp:
                    return rec.timestamp, rec.offset
    except (ValueError, IndexError):
        pass  # compressed with a codec we do not decode: batch-level answer
    return batch_ts, offset
