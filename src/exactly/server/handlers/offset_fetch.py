"""OffsetFetch (9) v1-v8: a group's committed offsets (v2+: ``topics=null`` means all of them).

v1-v7 ask for one group and v8 for several. A group-level error (COORDINATOR_LOAD_IN_PROGRESS)
goes to the top-level ``error_code`` from v2; v1 has none, so Kafka repeats it in every requested
partition. Per-partition errors (UNSTABLE_OFFSET_COMMIT for ``require_stable``, v7+) stay per
partition. A group that does not exist has no offsets: -1 for the requested partitions, no error.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.coordinator.group.api import (
    FetchGroup,
    FetchGroupResult,
    FetchPartitionResult,
    FetchTopic,
    FetchTopicResult,
    OffsetFetchRequestData,
)
from exactly.protocol.apis import ApiKey, build
from exactly.server.authz import DESCRIBE, GROUP, TOPIC, authorize

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.OFFSET_FETCH
BATCHED_VERSION = 8


def _fetch_group(group_id: str, topics: Any) -> FetchGroup:
    if topics is None:
        return FetchGroup(group_id, None)
    return FetchGroup(group_id, tuple(FetchTopic(t.name, tuple(t.partition_indexes)) for t in topics))


def _error_result(group: FetchGroup, error: ErrorCode, per_partition: bool) -> FetchGroupResult:
    if not per_partition or group.topics is None:
        return FetchGroupResult(group_id=group.group_id, error_code=error)
    return FetchGroupResult(
        group_id=group.group_id,
        error_code=error,
        topics=tuple(
            FetchTopicResult(
                t.name,
                tuple(FetchPartitionResult(partition_index=p, error_code=error) for p in t.partition_indexes),
            )
            for t in group.topics
        ),
    )


def _visible(
    broker: Broker, ctx: RequestContext, group: FetchGroup, result: FetchGroupResult
) -> FetchGroupResult:
    """Kafka: topics the caller may not DESCRIBE get TOPIC_AUTHORIZATION_FAILED when named, and
    are left out of an all-topics fetch."""
    if broker.authorizer is None:
        return result
    named = group.topics is not None
    topics = []
    for t in result.topics:
        if authorize(broker, ctx, DESCRIBE, TOPIC, t.name, log_denied=named):
            topics.append(t)
        elif named:
            code = ErrorCode.topic_authorization_failed
            topics.append(
                FetchTopicResult(
                    t.name,
                    tuple(
                        FetchPartitionResult(partition_index=p.partition_index, error_code=code)
                        for p in t.partitions
                    ),
                )
            )
    return FetchGroupResult(group_id=result.group_id, topics=tuple(topics), error_code=result.error_code)


def _answer(
    broker: Broker, ctx: RequestContext, group: FetchGroup, result: FetchGroupResult
) -> FetchGroupResult:
    """The coordinator's answer for ``group``: its offsets, or its group-level error (the
    coordinator's own ownership check, ``GroupCoordinator.owner_error``) shaped as the handler's
    own refusals are."""
    if result.error_code is not ErrorCode.none:
        return _error_result(group, result.error_code, per_partition=ctx.version < 2)
    return _visible(broker, ctx, group, result)


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    runtime = broker.groups
    batched = ctx.version >= BATCHED_VERSION
    if batched:
        groups = tuple(_fetch_group(g.group_id, g.topics) for g in request.groups)
    else:
        groups = (_fetch_group(request.group_id, request.topics),)
    refused = [
        runtime.load_error_for(g.group_id)
        if authorize(broker, ctx, DESCRIBE, GROUP, g.group_id)
        else ErrorCode.group_authorization_failed
        for g in groups
    ]
    ours = tuple(g for g, code in zip(groups, refused, strict=True) if code is ErrorCode.none)
    fetched: Iterator[FetchGroupResult] = iter(())
    if ours:
        data = OffsetFetchRequestData(
            groups=ours, require_stable=bool(getattr(request, "require_stable", False))
        )
        fetched = iter(runtime.coordinator.offset_fetch(data).groups)
    results = tuple(
        _answer(broker, ctx, g, next(fetched))
        if code is ErrorCode.none
        else _error_result(g, code, per_partition=ctx.version < 2)
        for g, code in zip(groups, refused, strict=True)
    )
    mod = ctx.api.response_module
    for r in results:
        broker.metrics.error(API_KEY, r.error_code)
    if not batched:
        (result,) = results
        return build(
            ctx.api.response_type,
            error_code=result.error_code,
            topics=_topics(mod, "OffsetFetchResponseTopic", "OffsetFetchResponsePartition", result),
        )
    return build(
        ctx.api.response_type,
        groups=tuple(
            build(
                mod.OffsetFetchResponseGroup,
                group_id=r.group_id,
                error_code=r.error_code,
                topics=_topics(mod, "OffsetFetchResponseTopics", "OffsetFetchResponsePartitions", r),
            )
            for r in results
        ),
    )


def _topics(mod: Any, topic_name: str, partition_name: str, result: FetchGroupResult) -> tuple[Any, ...]:
    topic_cls = getattr(mod, topic_name)
    partition_cls = getattr(mod, partition_name)
    return tuple(
        build(
            topic_cls,
            name=t.name,
            partitions=tuple(
                build(
                    partition_cls,
                    partition_index=p.partition_index,
                    committed_offset=p.committed_offset,
                    committed_leader_epoch=p.committed_leader_epoch,
                    metadata=p.metadata,
                    error_code=p.error_code,
                )
                for p in t.partitions
            ),
        )
        for t in result.topics
    )
