"""OffsetCommit (8) v2-v8: store a group's consumed positions in ``__consumer_offsets``.

As in Kafka's ``KafkaApis``, partitions of topics (or partition numbers) that do not exist are
answered UNKNOWN_TOPIC_OR_PARTITION without reaching the coordinator; the rest are answered when
their append completed. v2-v4 carry ``retention_time`` (-1: broker default).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.coordinator.group.api import (
    CommitPartition,
    CommitTopic,
    OffsetCommitRequestData,
    OffsetCommitResponseData,
)
from exactly.protocol.apis import ApiKey, build
from exactly.server.authz import GROUP, READ, TOPIC, authorize
from exactly.server.clock import now_ms
from exactly.server.group_runtime import millis

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.OFFSET_COMMIT

PartitionErrors = dict[tuple[str, int], ErrorCode]


def to_commit_topics(topics: Iterable[Any]) -> tuple[CommitTopic, ...]:
    """kio OffsetCommit/TxnOffsetCommit request topics (any version) -> coordinator values."""
    return tuple(
        CommitTopic(
            t.name,
            tuple(
                CommitPartition(
                    partition_index=p.partition_index,
                    committed_offset=p.committed_offset,
                    committed_leader_epoch=getattr(p, "committed_leader_epoch", -1),
                    committed_metadata=p.committed_metadata,
                )
                for p in t.partitions
            ),
        )
        for t in topics
    )


def split_unknown(
    broker: Broker, topics: tuple[CommitTopic, ...]
) -> tuple[tuple[CommitTopic, ...], PartitionErrors]:
    """Keep the partitions that exist; the others get UNKNOWN_TOPIC_OR_PARTITION."""
    known: list[CommitTopic] = []
    errors: PartitionErrors = {}
    for topic in topics:
        info = broker.logs.topic(topic.name)
        keep = []
        for p in topic.partitions:
            if info is not None and 0 <= p.partition_index < info.partitions:
                keep.append(p)
            else:
                errors[(topic.name, p.partition_index)] = ErrorCode.unknown_topic_or_partition
        if keep:
            known.append(CommitTopic(topic.name, tuple(keep)))
    return tuple(known), errors


def split_unauthorized(
    broker: Broker, ctx: RequestContext, topics: tuple[CommitTopic, ...]
) -> tuple[tuple[CommitTopic, ...], PartitionErrors]:
    """Keep the topics the caller may READ; the others' partitions get TOPIC_AUTHORIZATION_FAILED
    (checked before existence, so an unauthorized name is never revealed to exist)."""
    kept: list[CommitTopic] = []
    errors: PartitionErrors = {}
    for topic in topics:
        if authorize(broker, ctx, READ, TOPIC, topic.name):
            kept.append(topic)
        else:
            for p in topic.partitions:
                errors[(topic.name, p.partition_index)] = ErrorCode.topic_authorization_failed
    return tuple(kept), errors


def whole_request(topics: tuple[CommitTopic, ...], code: ErrorCode) -> PartitionErrors:
    return {(t.name, p.partition_index): code for t in topics for p in t.partitions}


def merge(response: OffsetCommitResponseData, errors: PartitionErrors) -> PartitionErrors:
    out = dict(errors)
    for t in response.topics:
        for p in t.partitions:
            out[(t.name, p.partition_index)] = p.error_code
    return out


def build_response(
    broker: Broker, ctx: RequestContext, api_key: int, topics: Iterable[Any], errors: PartitionErrors
) -> Any:
    """The kio response in request order (OffsetCommit and TxnOffsetCommit share the shape)."""
    mod = ctx.api.response_module
    topic_cls = getattr(mod, "OffsetCommitResponseTopic", None) or mod.TxnOffsetCommitResponseTopic
    partition_cls = (
        getattr(mod, "OffsetCommitResponsePartition", None) or mod.TxnOffsetCommitResponsePartition
    )
    out = []
    for t in topics:
        partitions = []
        for p in t.partitions:
            code = errors.get((t.name, p.partition_index), ErrorCode.none)
            broker.metrics.error(api_key, code)
            partitions.append(build(partition_cls, partition_index=p.partition_index, error_code=code))
        out.append(build(topic_cls, name=t.name, partitions=tuple(partitions)))
    return build(ctx.api.response_type, topics=tuple(out))


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    runtime = broker.groups
    topics = to_commit_topics(request.topics)
    if not authorize(broker, ctx, READ, GROUP, request.group_id):
        errors = whole_request(topics, ErrorCode.group_authorization_failed)
        return build_response(broker, ctx, API_KEY, request.topics, errors)
    if (load_error := runtime.load_error_for(request.group_id)) is not ErrorCode.none:
        return build_response(broker, ctx, API_KEY, request.topics, whole_request(topics, load_error))
    allowed, errors = split_unauthorized(broker, ctx, topics)
    known, unknown = split_unknown(broker, allowed)
    errors.update(unknown)
    if known:
        retention = getattr(request, "retention_time", None)
        data = OffsetCommitRequestData(
            group_id=request.group_id,
            topics=known,
            generation_id=request.generation_id_or_member_epoch,
            member_id=request.member_id,
            group_instance_id=getattr(request, "group_instance_id", None),
            retention_time_ms=-1 if retention is None else millis(retention),
            api_version=ctx.version,
        )
        coordinator = runtime.coordinator
        response: OffsetCommitResponseData = await runtime.call(
            lambda token: coordinator.offset_commit(data, now_ms(), token)
        )
        errors = merge(response, errors)
    return build_response(broker, ctx, API_KEY, request.topics, errors)
