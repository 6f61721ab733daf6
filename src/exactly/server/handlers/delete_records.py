"""DeleteRecords (21), v0-v2 (v2 flexible): move partitions' log start offsets.

Kafka's ReplicaManager.deleteRecords / Partition.deleteRecordsOnLeader, per partition:

* internal topics -> INVALID_TOPIC_EXCEPTION (never touched);
* an unknown topic or partition -> UNKNOWN_TOPIC_OR_PARTITION;
* cleanup.policy without ``delete`` (``compact``) -> POLICY_VIOLATION;
* offset -1 means the high watermark; another negative offset, or one above the high watermark,
  -> OFFSET_OUT_OF_RANGE;
* otherwise the log start offset moves up to the offset (never down) and the answer carries the
  new log start offset as the low watermark (-1 with an error, Kafka's INVALID_LOW_WATERMARK).

Kafka waits (up to ``timeout``) for followers to reach the new start; with one replica the
low watermark is known at once, so the timeout is not used. Unlike Kafka the new start offsets
are checkpointed (fsynced) before the answer is sent, see LogManager.delete_records.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import ApiKey, build
from exactly.server.authz import DELETE, TOPIC, authorize
from exactly.storage.log_manager import PolicyViolationError, UnknownTopicError
from exactly.storage.log_read import OffsetOutOfRangeError
from exactly.topics import INTERNAL_TOPICS
from exactly.types import TopicPartition

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

log = logging.getLogger(__name__)

API_KEY = ApiKey.DELETE_RECORDS

INVALID_LOW_WATERMARK = -1

_ERRORS: dict[type[Exception], ErrorCode] = {
    UnknownTopicError: ErrorCode.unknown_topic_or_partition,
    PolicyViolationError: ErrorCode.policy_violation,
    OffsetOutOfRangeError: ErrorCode.offset_out_of_range,
}


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    mod = ctx.api.response_module
    wanted: dict[TopicPartition, int] = {}
    refused: dict[TopicPartition, ErrorCode] = {}
    for topic in request.topics:
        allowed = authorize(broker, ctx, DELETE, TOPIC, topic.name)  # before existence
        for p in topic.partitions:
            tp = TopicPartition(topic.name, p.partition_index)
            if not allowed:
                refused[tp] = ErrorCode.topic_authorization_failed
            elif topic.name in INTERNAL_TOPICS:
                refused[tp] = ErrorCode.invalid_topic_exception
            else:
                wanted[tp] = p.offset
    results = broker.logs.delete_records(wanted)
    topics = []
    for topic in request.topics:
        parts = []
        for p in topic.partitions:
            tp = TopicPartition(topic.name, p.partition_index)
            code = refused.get(tp, ErrorCode.none)
            low_watermark = INVALID_LOW_WATERMARK
            outcome = results.get(tp)
            if isinstance(outcome, Exception):
                code = _ERRORS[type(outcome)]
                log.info("DeleteRecords %s to offset %d refused: %s", tp, p.offset, outcome)
            elif outcome is not None:
                low_watermark = outcome
            broker.metrics.error(ApiKey.DELETE_RECORDS, code)
            parts.append(
                build(
                    mod.DeleteRecordsPartitionResult,
                    partition_index=p.partition_index,
                    low_watermark=low_watermark,
                    error_code=code,
                )
            )
        topics.append(build(mod.DeleteRecordsTopicResult, name=topic.name, partitions=tuple(parts)))
    return build(ctx.api.response_type, topics=tuple(topics))
