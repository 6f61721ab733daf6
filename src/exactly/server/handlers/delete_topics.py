"""DeleteTopics (20): by name (v1-v5) or by name or id (v6)."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import ApiKey, build
from exactly.server.authz import DELETE, TOPIC, authorize
from exactly.storage.log_manager import UnknownTopicError
from exactly.topics import INTERNAL_TOPICS

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.DELETE_TOPICS

ZERO_UUID = uuid.UUID(int=0)


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    if broker.replicas is not None:
        return await _handle_cluster(broker, ctx, request)
    mod = ctx.api.response_module
    if ctx.version >= 6:
        wanted = [(t.name, t.topic_id) for t in request.topics]
    else:
        wanted = [(name, None) for name in request.topic_names]
    results = []
    for name, topic_id in wanted:
        code = ErrorCode.none
        message = None
        info = None
        if name is None and topic_id is not None and topic_id != ZERO_UUID:
            info = broker.logs.topic_by_id(topic_id)
            if info is None:
                code = ErrorCode.unknown_topic_id
            elif not authorize(broker, ctx, DELETE, TOPIC, info.name):
                code, info = ErrorCode.topic_authorization_failed, None
        elif name is not None and not authorize(broker, ctx, DELETE, TOPIC, name):
            code = ErrorCode.topic_authorization_failed  # before existence: never revealed
        elif name is not None:
            info = broker.logs.topic(name)
            if info is None:
                code = ErrorCode.unknown_topic_or_partition
        else:
            code = ErrorCode.invalid_request
        if info is not None:
            if info.name in INTERNAL_TOPICS:
                code, message = ErrorCode.topic_deletion_disabled, "Internal topics cannot be deleted"
            elif not broker.config.get_bool("delete.topic.enable"):
                code, message = ErrorCode.topic_deletion_disabled, "Topic deletion is disabled."
            else:
                try:
                    broker.logs.delete_topic(info.name)
                except UnknownTopicError:
                    code = ErrorCode.unknown_topic_or_partition
        broker.metrics.error(ApiKey.DELETE_TOPICS, code)
        results.append(
            build(
                mod.DeletableTopicResult,
                name=info.name if info is not None else name,
                topic_id=info.topic_id if info is not None else (topic_id or ZERO_UUID),
                error_code=code,
                error_message=message,
            )
        )
    return build(ctx.api.response_type, responses=tuple(results))


async def _handle_cluster(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    """Cluster mode, Kafka's path: mark ``/admin/delete_topics/<t>``, the controller removes the
    topic's znodes, every broker deletes its replicas when it sees the topic gone; the answer
    waits (up to the request timeout) until this broker's metadata no longer has the topic."""
    replicas = broker.replicas
    assert replicas is not None
    mod = ctx.api.response_module
    cache = replicas.cache
    if ctx.version >= 6:
        wanted = [(t.name, t.topic_id) for t in request.topics]
    else:
        wanted = [(name, None) for name in request.topic_names]
    timeout_s = max(request.timeout.total_seconds(), 0.0)
    results = []
    for name, topic_id in wanted:
        code, message = ErrorCode.none, None
        if name is None and topic_id is not None and topic_id != ZERO_UUID:
            name = replicas.topics.topic_name_by_id(topic_id)
            if name is None:
                code = ErrorCode.unknown_topic_id
        elif name is None:
            code = ErrorCode.invalid_request
        elif not authorize(broker, ctx, DELETE, TOPIC, name):
            code, message = ErrorCode.topic_authorization_failed, None
        elif cache.topic(name) is None:
            code = ErrorCode.unknown_topic_or_partition
        found_id = (
            replicas.topics.topic_id(name)
            if name is not None and code != ErrorCode.topic_authorization_failed
            else None
        )
        if code == ErrorCode.none and name is not None:
            if name in INTERNAL_TOPICS:
                code, message = ErrorCode.topic_deletion_disabled, "Internal topics cannot be deleted"
            elif not broker.config.get_bool("delete.topic.enable"):
                code, message = ErrorCode.topic_deletion_disabled, "Topic deletion is disabled."
            else:
                if not await replicas.topics.delete_topic(name, timeout_s):
                    code, message = ErrorCode.request_timed_out, f"Timed out deleting {name}"
        broker.metrics.error(ApiKey.DELETE_TOPICS, code)
        results.append(
            build(
                mod.DeletableTopicResult,
                name=name,
                topic_id=found_id or topic_id or ZERO_UUID,
                error_code=code,
                error_message=message,
            )
        )
    return build(ctx.api.response_type, responses=tuple(results))
