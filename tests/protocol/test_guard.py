"""protocol.guard: unknown tagged fields are cut out (Kafka skips them; kio raises on them), at any
nesting depth, and bodies without them or that cannot be walked are left to kio."""

from __future__ import annotations

import pytest

from exactly.protocol.apis import schema
from exactly.protocol.guard import overlong_array, without_unknown_tags

OFFSET_FETCH_V6 = schema(9, 6)

# OffsetFetch v6: group_id "g", topics [{name "t", partition_indexes [0], <tags>}], <tags>
PLAIN = b"\x02g" + b"\x02" + b"\x02t" + b"\x02\x00\x00\x00\x00" + b"\x00" + b"\x00"
WITH_TAGS = (
    b"\x02g"
    + b"\x02"
    + b"\x02t"
    + b"\x02\x00\x00\x00\x00"
    + b"\x02\x05\x01\xff\x06\x00"  # nested struct: tags 5 and 6
    + b"\x01\x63\x03abc"  # top level: tag 99
)


def test_plain_body_parses_and_needs_no_edit() -> None:
    request, _ = OFFSET_FETCH_V6.read_request(PLAIN, 0)
    assert request.group_id == "g"
    assert without_unknown_tags(OFFSET_FETCH_V6.request_type, PLAIN, 0) is None


def test_unknown_tags_at_every_level_are_removed() -> None:
    with pytest.raises(KeyError):
        OFFSET_FETCH_V6.read_request(WITH_TAGS, 0)
    stripped = without_unknown_tags(OFFSET_FETCH_V6.request_type, b"HEAD" + WITH_TAGS, 4)
    assert stripped == PLAIN
    assert OFFSET_FETCH_V6.read_request(stripped, 0) == OFFSET_FETCH_V6.read_request(PLAIN, 0)


def test_truncated_body_is_left_to_kio() -> None:
    assert without_unknown_tags(OFFSET_FETCH_V6.request_type, WITH_TAGS[:-2], 0) is None


def test_overlong_array_is_named() -> None:
    body = b"\x02g" + b"\xff\xff\xff\x7f"  # topics claims 2**28 - 2 entries in a 6-byte body
    assert overlong_array(OFFSET_FETCH_V6.request_type, body, 0) == "OffsetFetchRequest.topics[268435454]"


def test_null_where_the_schema_allows_none_is_named() -> None:
    join_v5 = schema(11, 5)
    head = b"\x00\x01g" + b"\x00\x00\x10\x00" * 2 + b"\x00\x00" + b"\xff\xff" + b"\x00\x01c"
    assert overlong_array(join_v5.request_type, head + b"\xff\xff\xff\xff", 0) == (
        "null JoinGroupRequest.protocols is not nullable"
    )
    assert overlong_array(join_v5.request_type, head + b"\x00\x00\x00\x00", 0) is None
    # group_instance_id (the \xff\xff) is nullable; group_id is not
    assert overlong_array(join_v5.request_type, b"\xff\xff" + head[3:] + b"\x00\x00\x00\x00", 0) == (
        "null JoinGroupRequest.group_id is not nullable"
    )
