"""ApiVersions answers from an encoded body kept per version: what it answers is what building
and encoding the response afresh gives, the same for every request of a version, and it lists
exactly the version table."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kio.serial import entity_reader

from exactly.protocol.apis import VERSION_RANGES, ApiKey, encode_response, schema, supported_apis
from exactly.protocol.header import RequestHeader
from exactly.server.dispatch import RequestContext
from exactly.server.handlers import api_versions

LO, HI = VERSION_RANGES[ApiKey.API_VERSIONS]
VERSIONS = list(range(LO, HI + 1))


def answer(version: int, correlation_id: int) -> Any:
    api = schema(ApiKey.API_VERSIONS, version)
    ctx = RequestContext(RequestHeader(int(ApiKey.API_VERSIONS), version, correlation_id, "c"), api, "peer")
    return asyncio.run(api_versions.handle(None, ctx, None))  # type: ignore[arg-type]


@pytest.mark.parametrize("version", VERSIONS)
def test_answer_is_the_fresh_encoding_every_time(version: int) -> None:
    api = schema(ApiKey.API_VERSIONS, version)
    fresh = encode_response(api, api_versions.response(api))
    first, second = answer(version, 1), answer(version, 2)
    assert isinstance(first, bytes)
    assert first == fresh
    assert second == fresh


@pytest.mark.parametrize("version", VERSIONS)
def test_answer_lists_the_version_table(version: int) -> None:
    api = schema(ApiKey.API_VERSIONS, version)
    decoded, used = entity_reader(api.response_type)(answer(version, 7), 0)
    assert used > 0
    assert int(decoded.error_code) == 0
    listed = [(int(k.api_key), (int(k.min_version), int(k.max_version))) for k in decoded.api_keys]
    assert listed == supported_apis()
