"""FindCoordinator (10): the broker that coordinates a group or a transactional id.

Like Kafka, the first lookup of a kind creates its internal topic (``__consumer_offsets`` for
groups, ``__transaction_state`` for transactions). v0-v3 carry one key (v0: groups only); v4+
batch ``coordinator_keys`` and answer each key separately. An unknown key type is
INVALID_REQUEST (Kafka's ``CoordinatorType.forId`` throws), with no coordinator node.

A single broker coordinates every key. The coordinator's endpoint is the one of the listener the
request came in on. In cluster mode the coordinator of a key is the current
leader of its partition of the internal topic, from the metadata cache; COORDINATOR_NOT_AVAILABLE
while the topic is being created (or cannot be: too few live brokers) or the partition has no
live leader. The leader itself answers COORDINATOR_LOAD_IN_PROGRESS until it has loaded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.coordinator.group.records import partition_for as group_partition
from exactly.coordinator.txn.log import partition_for as txn_partition
from exactly.protocol.apis import ApiKey, build
from exactly.server.authz import DESCRIBE, GROUP, TXN_ID, authorize
from exactly.topics import CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC
from exactly.types import TopicPartition

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.FIND_COORDINATOR
MIN_BATCHED_VERSION = 4
KEY_TYPE_TOPICS = {0: CONSUMER_OFFSETS_TOPIC, 1: TRANSACTION_STATE_TOPIC}
INVALID_REQUEST_MESSAGE = (
    "This most likely occurs because of a request being malformed by the client library or the "
    "message was sent to an incompatible broker. See the broker logs for more details."
)
COORDINATOR_NOT_AVAILABLE_MESSAGE = "The coordinator is not available."


Coordinator = tuple[ErrorCode, str | None, int, str, int]  # error, message, node, host, port


def _refused(error: ErrorCode, message: str | None) -> Coordinator:
    return error, message, -1, "", -1


def _find(broker: Broker, ctx: RequestContext, key_type: int, key: str) -> Coordinator:
    topic = KEY_TYPE_TOPICS.get(key_type)
    if topic is None:
        return _refused(ErrorCode.invalid_request, INVALID_REQUEST_MESSAGE)
    # DESCRIBE on the group / transactional id, before the internal topic is even asked for
    if key_type == 0 and not authorize(broker, ctx, DESCRIBE, GROUP, key):
        return _refused(ErrorCode.group_authorization_failed, "Group authorization failed.")
    if key_type == 1 and not authorize(broker, ctx, DESCRIBE, TXN_ID, key):
        return _refused(
            ErrorCode.transactional_id_authorization_failed, "Transactional Id authorization failed."
        )
    error = broker.internal.request(topic)
    if error is not ErrorCode.none:
        return _refused(error, COORDINATOR_NOT_AVAILABLE_MESSAGE)
    replicas = broker.replicas
    if replicas is None:
        adv = broker.advertised_for(ctx.listener) or broker.advertised
        assert adv is not None
        return ErrorCode.none, None, broker.node_id, adv.host, adv.port
    partitions = broker.internal.partitions_of(topic)
    partition = group_partition(key, partitions) if key_type == 0 else txn_partition(key, partitions)
    leader = replicas.cache.leader(TopicPartition(topic, partition))
    if leader is None:
        return _refused(ErrorCode.coordinator_not_available, COORDINATOR_NOT_AVAILABLE_MESSAGE)
    endpoint = leader.endpoint_for(ctx.listener)  # on the listener the request came in on
    if endpoint is None:
        return _refused(ErrorCode.coordinator_not_available, COORDINATOR_NOT_AVAILABLE_MESSAGE)
    return ErrorCode.none, None, leader.broker_id, endpoint[0], endpoint[1]


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    key_type = int(getattr(request, "key_type", 0))
    if ctx.version < MIN_BATCHED_VERSION:
        error, message, node_id, host, port = _find(broker, ctx, key_type, request.key)
        broker.metrics.error(API_KEY, error)
        ok = error is ErrorCode.none
        return build(
            ctx.api.response_type,
            error_code=error,
            error_message="NONE" if ok else message,  # Kafka sends Errors.message(): "NONE"
            node_id=node_id,
            host=host,
            port=port,
        )
    mod = ctx.api.response_module
    coordinators = []
    for key in request.coordinator_keys:
        error, message, node_id, host, port = _find(broker, ctx, key_type, key)
        broker.metrics.error(API_KEY, error)
        coordinators.append(
            build(
                mod.Coordinator,
                key=key,
                node_id=node_id,
                host=host,
                port=port,
                error_code=error,
                # Kafka's v4+ builder never sets it: the schema default "" (not null); on an
                # error exactly still says why (a deliberate difference, notes/wire-conformance.md)
                error_message="" if error is ErrorCode.none else message,
            )
        )
    return build(ctx.api.response_type, coordinators=tuple(coordinators))
