"""SaslAuthenticate (36) reaching the API layer: the connection is already authenticated, or its
listener has no SASL. Kafka answers ILLEGAL_SASL_STATE (re-authentication, KIP-368, is not
supported). The tokens of an unauthenticated SASL connection never get here: the
connection's authenticator (exactly.security.sasl) handles it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import ApiKey
from exactly.security.sasl import illegal_state_response

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.SASL_AUTHENTICATE


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    broker.metrics.error(API_KEY, ErrorCode.illegal_sasl_state)
    return illegal_state_response(ctx.api)
