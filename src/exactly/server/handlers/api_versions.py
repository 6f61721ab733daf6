"""ApiVersions (18): advertise exactly the (api, version) ranges the dispatcher accepts.

Fast path: the answer depends on nothing but the request's version (the version table is fixed
when the package is imported), and every client connection sends one before anything else.
Built and encoded through the generic codec it cost ~0.25 ms of broker CPU per connection
(78 ApiVersion entries; profiled as a visible part of a short producer's broker CPU), so each
version's body is encoded once and the encoded bytes are answered from then on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import ApiKey, build, encode_response, supported_apis

if TYPE_CHECKING:
    from exactly.protocol.apis import ApiSchema
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.API_VERSIONS

# request version -> the encoded response body (without the response header, which carries the
# correlation id and is written by the dispatcher)
_ENCODED: dict[int, bytes] = {}


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> bytes:
    body = _ENCODED.get(ctx.version)
    if body is None:
        body = _ENCODED[ctx.version] = encode_response(ctx.api, response(ctx.api))
    return body


def response(api: ApiSchema) -> Any:
    """The ApiVersions response of ``api``'s version (the object ``handle`` encodes)."""
    mod = api.response_module
    return build(
        api.response_type,
        error_code=ErrorCode.none,
        api_keys=tuple(
            build(mod.ApiVersion, api_key=k, min_version=lo, max_version=hi)
            for k, (lo, hi) in supported_apis()
        ),
        finalized_features_epoch=-1,
    )
