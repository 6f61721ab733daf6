"""TxnOffsetCommit (28) v0-v4: offsets committed inside a producer's transaction (KIP-98/447).

The coordinator appends them as a transactional batch of the producer; they stay pending (and
OffsetFetch with ``require_stable`` answers UNSTABLE_OFFSET_COMMIT) until the transaction's
COMMIT/ABORT marker reaches the group's ``__consumer_offsets`` partition (``on_marker``). Before v3
the request carries no member data (generation -1, empty member id). Unknown partitions are
answered UNKNOWN_TOPIC_OR_PARTITION before the coordinator, as Kafka does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.coordinator.group.api import OffsetCommitResponseData, TxnOffsetCommitRequestData
from exactly.protocol.apis import ApiKey
from exactly.server.authz import GROUP, READ, TXN_ID, WRITE, authorize
from exactly.server.clock import now_ms
from exactly.server.handlers.offset_commit import (
    PartitionErrors,
    build_response,
    merge,
    split_unauthorized,
    split_unknown,
    to_commit_topics,
    whole_request,
)

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.TXN_OFFSET_COMMIT


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    runtime = broker.groups
    topics = to_commit_topics(request.topics)
    errors: PartitionErrors
    if not authorize(broker, ctx, WRITE, TXN_ID, request.transactional_id):
        errors = whole_request(topics, ErrorCode.transactional_id_authorization_failed)
        return build_response(broker, ctx, API_KEY, request.topics, errors)
    if not authorize(broker, ctx, READ, GROUP, request.group_id):
        errors = whole_request(topics, ErrorCode.group_authorization_failed)
        return build_response(broker, ctx, API_KEY, request.topics, errors)
    if (load_error := runtime.load_error_for(request.group_id)) is not ErrorCode.none:
        return build_response(broker, ctx, API_KEY, request.topics, whole_request(topics, load_error))
    allowed, errors = split_unauthorized(broker, ctx, topics)
    known, unknown = split_unknown(broker, allowed)
    errors.update(unknown)
    if known:
        data = TxnOffsetCommitRequestData(
            transactional_id=request.transactional_id,
            group_id=request.group_id,
            producer_id=request.producer_id,
            producer_epoch=request.producer_epoch,
            topics=known,
            generation_id=getattr(request, "generation_id", -1),
            member_id=getattr(request, "member_id", ""),
            group_instance_id=getattr(request, "group_instance_id", None),
        )
        coordinator = runtime.coordinator
        response: OffsetCommitResponseData = await runtime.call(
            lambda token: coordinator.txn_offset_commit(data, now_ms(), token)
        )
        errors = merge(response, errors)
    return build_response(broker, ctx, API_KEY, request.topics, errors)
