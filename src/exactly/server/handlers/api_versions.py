"""ApiVersions (18): advertise exactly the (api, version) ranges the dispatcher accepts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import ApiKey, build, supported_apis

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.API_VERSIONS


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    mod = ctx.api.response_module
    return build(
        ctx.api.response_type,
        error_code=ErrorCode.none,
        api_keys=tuple(
            build(mod.ApiVersion, api_key=k, min_version=lo, max_version=hi)
            for k, (lo, hi) in supported_apis()
        ),
        finalized_features_epoch=-1,
    )
