"""The API table and version-agnostic response building."""

from __future__ import annotations

import datetime

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import VERSION_RANGES, ApiKey, build, encode_response, schema


def test_every_advertised_version_has_a_schema() -> None:
    for key, (lo, hi) in VERSION_RANGES.items():
        for version in range(lo, hi + 1):
            api = schema(key, version)
            assert api.request_type.__version__ == version


def test_build_drops_unknown_fields_and_fills_missing() -> None:
    for version in (3, 5, 9, 11):
        api = schema(0, version)
        mod = api.response_module
        part = build(
            mod.PartitionProduceResponse,
            index=1,
            error_code=ErrorCode.none,
            base_offset=42,
            log_start_offset=0,
        )
        resp = build(
            api.response_type,
            responses=(build(mod.TopicProduceResponse, name="t", partition_responses=(part,)),),
        )
        assert resp.throttle_time == datetime.timedelta(0)
        body = encode_response(api, resp)
        assert b"t" in body and len(body) > 20


def test_offsets_for_leader_epoch_offers_librdkafkas_version() -> None:
    # librdkafka validates a consumer's position after a leader change (KIP-320) with v2 only,
    # and skips the check, silently, against a broker that does not offer it
    lo, hi = VERSION_RANGES[ApiKey.OFFSET_FOR_LEADER_EPOCH]
    assert lo <= 2 <= hi
