"""One module per API; this table maps API keys to their handlers.

A handler is ``async def handle(broker, ctx, request) -> response | bytes | None``: a kio response
object (encoded by the dispatcher), a hand-encoded body (bytes, or a list of chunks written with
``writelines``), or None (acks=0 produce: no response).
``PARSERS`` lists the APIs whose requests are parsed by hand instead of by kio.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from exactly.protocol.apis import ApiKey
from exactly.protocol.fast import parse_produce_request
from exactly.server.handlers import (
    api_versions,
    create_topics,
    delete_topics,
    describe_cluster,
    describe_configs,
    fetch,
    init_producer_id,
    list_offsets,
    metadata,
    produce,
)

Handler = Callable[[Any, Any, Any], Awaitable[Any]]

HANDLERS: dict[int, Handler] = {
    ApiKey.PRODUCE: produce.handle,
    ApiKey.FETCH: fetch.handle,
    ApiKey.LIST_OFFSETS: list_offsets.handle,
    ApiKey.METADATA: metadata.handle,
    ApiKey.API_VERSIONS: api_versions.handle,
    ApiKey.CREATE_TOPICS: create_topics.handle,
    ApiKey.DELETE_TOPICS: delete_topics.handle,
    ApiKey.INIT_PRODUCER_ID: init_producer_id.handle,
    ApiKey.DESCRIBE_CONFIGS: describe_configs.handle,
    ApiKey.DESCRIBE_CLUSTER: describe_cluster.handle,
}

PARSERS: dict[int, Callable[[bytes | bytearray, int, int], Any]] = {
    ApiKey.METADATA: metadata.parse_request,
    ApiKey.PRODUCE: parse_produce_request,
}
