"""FindCoordinator (10): this broker coordinates every group and every transactional id.

Like Kafka, the first lookup of a kind creates its internal topic (``__consumer_offsets`` for
groups, ``__transaction_state`` for transactions). v0-v3 carry one key (v0: groups only); v4+
batch ``coordinator_keys`` and answer each key separately. An unknown key type is
INVALID_REQUEST (Kafka's ``CoordinatorType.forId`` throws), with no coordinator node.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import ApiKey, build
from exactly.server.internal_topics import AppendFailed
from exactly.topics import CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC

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

log = logging.getLogger("exactly.find_coordinator")


def _lookup(broker: Broker, key_type: int) -> tuple[ErrorCode, str | None]:
    topic = KEY_TYPE_TOPICS.get(key_type)
    if topic is None:
        return ErrorCode.invalid_request, INVALID_REQUEST_MESSAGE
    try:
        broker.internal.ensure(topic)
    except AppendFailed as exc:
        log.error("cannot create %s: %s", topic, exc)
        return ErrorCode.coordinator_not_available, COORDINATOR_NOT_AVAILABLE_MESSAGE
    return ErrorCode.none, None


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    adv = broker.advertised
    assert adv is not None
    key_type = int(getattr(request, "key_type", 0))
    error, message = _lookup(broker, key_type)
    broker.metrics.error(API_KEY, error)
    ok = error is ErrorCode.none
    node_id, host, port = (broker.node_id, adv.host, adv.port) if ok else (-1, "", -1)
    if ctx.version < MIN_BATCHED_VERSION:
        return build(
            ctx.api.response_type,
            error_code=error,
            error_message="NONE" if ok else message,  # Kafka sends Errors.message(): "NONE"
            node_id=node_id,
            host=host,
            port=port,
        )
    mod = ctx.api.response_module
    return build(
        ctx.api.response_type,
        coordinators=tuple(
            build(
                mod.Coordinator,
                key=key,
                node_id=node_id,
                host=host,
                port=port,
                error_code=error,
                # Kafka's v4+ builder never sets it: the schema default "" (not null); on an
                # error exactly still says why (a deliberate difference, notes/wire-conformance.md)
                error_message="" if ok else message,
            )
            for key in request.coordinator_keys
        ),
    )
