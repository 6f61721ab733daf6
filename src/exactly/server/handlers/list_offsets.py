"""ListOffsets (2), v1+: earliest (-2), latest (-1: high watermark, or the last stable offset
under isolation_level=1) and by timestamp (first record with timestamp >= the target).

By timestamp: the time index finds the first batch whose max timestamp reaches the target; that
one batch is then decoded to find the exact record, as Kafka does. This is the only broker path
that decodes records, and it is not a hot path.

The leader epoch of each answer is Kafka's: latest -> the current leader epoch; earliest -> the
epoch of the first epoch-cache entry if it starts at or below the log start, else -1; by
timestamp -> the leader epoch stamped in the batch found. KIP-320 clients keep it as the epoch of
their position and later ask OffsetsForLeaderEpoch where that epoch ends, to detect truncation.

Cluster: only the leader answers, at the epoch the client believes (FENCED_LEADER_EPOCH /
UNKNOWN_LEADER_EPOCH, then NOT_LEADER_OR_FOLLOWER). KIP-207: a new leader's high watermark can
lag the start of its own epoch (it learned the old leader's HW one fetch late, and waits for its
followers to fetch again); until it catches up, a client's "latest" and a timestamp with no
answer below the HW get the retriable OFFSET_NOT_AVAILABLE (LEADER_NOT_AVAILABLE before v5,
whose clients do not know code 78), as Kafka's ``Partition.fetchOffsetForTimestamp`` answers,
rather than an offset below what the previous leader already handed out (auto.offset.reset and
lag monitoring would see offsets go backwards). "Earliest" is answered. Replica requests
(replica_id >= 0) are answered as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import ApiKey, build
from exactly.records.batch import BatchHeader
from exactly.records.builder import decode_batch
from exactly.server.authz import DESCRIBE, TOPIC, authorize
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
    lagging_code = _lagging_code(request, ctx.version)
    topics = []
    for topic in request.topics:
        parts = []
        allowed = authorize(broker, ctx, DESCRIBE, TOPIC, topic.name)  # before existence
        for p in topic.partitions:
            tp = TopicPartition(topic.name, p.partition_index)
            if allowed:
                code, answer = _answer(broker, tp, p, committed, lagging_code)
            else:
                code, answer = ErrorCode.topic_authorization_failed, _NO_ANSWER
            if code != ErrorCode.none:
                broker.metrics.error(ApiKey.LIST_OFFSETS, code)
            ts, offset, leader_epoch = answer
            parts.append(
                build(
                    mod.ListOffsetsPartitionResponse,
                    partition_index=p.partition_index,
                    error_code=code,
                    timestamp=ts,
                    offset=offset,
                    leader_epoch=leader_epoch,
                )
            )
        topics.append(build(mod.ListOffsetsTopicResponse, name=topic.name, partitions=tuple(parts)))
    return build(ctx.api.response_type, topics=tuple(topics))


_NO_ANSWER = (-1, -1, -1)


def _lagging_code(request: Any, version: int) -> ErrorCode | None:
    """KIP-207's answer while a new leader's HW is below its epoch start; None for replica
    requests, which are answered anyway."""
    if int(getattr(request, "replica_id", CONSUMER_REPLICA_ID)) != CONSUMER_REPLICA_ID:
        return None
    if version >= OFFSET_NOT_AVAILABLE_SINCE:
        return ErrorCode.offset_not_available
    return ErrorCode.leader_not_available


def _answer(
    broker: Broker, tp: TopicPartition, p: Any, committed: bool, lagging_code: ErrorCode | None
) -> tuple[ErrorCode, tuple[int, int, int]]:
    """-> (error code, (timestamp, offset, leader epoch)) for one partition. ``lagging_code``:
    the answer while the leader's HW is below its epoch start (None: answer anyway)."""
    plog = broker.partition(tp.topic, tp.partition)
    replicas = broker.replicas
    epoch_start: int | None = None  # where the current leader epoch starts (cluster leaders)
    if replicas is not None and replicas.manages(tp):
        # Cluster: only the leader answers, at the epoch the client believes (KIP-320).
        code = replicas.check_read(tp, getattr(p, "current_leader_epoch", -1))
        leader = replicas.leaders.get(tp)
        if code != ErrorCode.none or leader is None or plog is None:
            return (code if code != ErrorCode.none else ErrorCode.unknown_topic_or_partition), _NO_ANSWER
        current_epoch = leader.leader_epoch
        epoch_start = leader.epoch_start_offset
    elif plog is None:
        return ErrorCode.unknown_topic_or_partition, _NO_ANSWER
    else:
        current_epoch = max(plog.leader_epochs.latest_epoch, 0)  # a single broker leads everything
    timestamp = p.timestamp
    lagging = lagging_code is not None and epoch_start is not None and epoch_start > plog.high_watermark
    if timestamp == LATEST:
        if lagging and lagging_code is not None:
            return lagging_code, _NO_ANSWER
        return ErrorCode.none, (
            -1,
            plog.last_stable_offset if committed else plog.high_watermark,
            current_epoch,
        )
    if timestamp == EARLIEST:
        return ErrorCode.none, (-1, plog.log_start_offset, _earliest_epoch(plog))
    found = _lookup(plog, timestamp, committed)
    if found == _NO_ANSWER and lagging and lagging_code is not None:
        return lagging_code, _NO_ANSWER
    return ErrorCode.none, found


def _earliest_epoch(plog: PartitionLog) -> int:
    entries = plog.leader_epochs.entries
    if entries and entries[0].start_offset <= plog.log_start_offset:
        return entries[0].epoch
    return -1


def _lookup(plog: PartitionLog, timestamp: int, committed: bool) -> tuple[int, int, int]:
    """By timestamp -> (record timestamp, offset, batch leader epoch), or ``_NO_ANSWER``."""
    # Kafka's Partition.fetchOffsetForTimestamp: only offsets a consumer of this isolation level
    # may read count (below the LSO for read_committed, below the high watermark otherwise).
    limit = plog.last_stable_offset if committed else plog.high_watermark
    found = plog.offset_for_timestamp(timestamp)
    if found is None or found[0] >= limit:
        return _NO_ANSWER
    offset, batch_ts = found
    epoch = -1
    try:
        data = plog.read(offset, 1, read_committed=False, min_one_batch=True).records
        assert isinstance(data, bytes)  # no slice_from: a copy, never a FileSlice
        if data:
            epoch = BatchHeader.parse(data, 0).partition_leader_epoch
            _header, records = decode_batch(data)
            for rec in records:
                if rec.offset >= limit:
                    break
                if rec.offset >= offset and rec.timestamp is not None and rec.timestamp >= timestamp:
                    return rec.timestamp, rec.offset, epoch
    except (ValueError, IndexError):
        pass  # compressed with a codec we do not decode: batch-level answer
    return batch_ts, offset, epoch
