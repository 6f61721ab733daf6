"""DescribeProducers (61, KIP-664): the active producers of partitions, from producer state."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import ApiKey, build
from exactly.server.authz import READ, TOPIC, authorize

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.DESCRIBE_PRODUCERS


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    mod = ctx.api.response_module
    topics = []
    for topic in request.topics:
        parts = []
        allowed = authorize(broker, ctx, READ, TOPIC, topic.name)
        for p in topic.partition_indexes:
            plog = broker.partition(topic.name, p)
            if not allowed:
                parts.append(
                    build(
                        mod.PartitionResponse,
                        partition_index=p,
                        error_code=ErrorCode.topic_authorization_failed,
                        error_message=None,
                    )
                )
                continue
            if plog is None:
                parts.append(
                    build(
                        mod.PartitionResponse,
                        partition_index=p,
                        error_code=ErrorCode.unknown_topic_or_partition,
                        error_message=None,
                    )
                )
                continue
            producers = tuple(
                build(
                    mod.ProducerState,
                    producer_id=e.producer_id,
                    producer_epoch=e.producer_epoch,
                    last_sequence=e.last_seq,
                    last_timestamp=e.last_timestamp,
                    coordinator_epoch=e.coordinator_epoch,
                    current_txn_start_offset=-1
                    if e.current_txn_first_offset is None
                    else e.current_txn_first_offset,
                )
                for e in sorted(plog.producers().values(), key=lambda e: e.producer_id)
            )
            parts.append(
                build(
                    mod.PartitionResponse,
                    partition_index=p,
                    error_code=ErrorCode.none,
                    error_message=None,
                    active_producers=producers,
                )
            )
        topics.append(build(mod.TopicResponse, name=topic.name, partitions=tuple(parts)))
    return build(ctx.api.response_type, topics=tuple(topics))
