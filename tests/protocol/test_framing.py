"""Frame decoder: whole frames in order, however the bytes are split; oversized frames refused."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactly.protocol.framing import FrameDecoder, FrameError, frame
from exactly.protocol.header import HeaderError, parse_request_header, response_header, skip_tagged_fields


@given(st.lists(st.binary(max_size=300), max_size=8), st.lists(st.integers(1, 50), min_size=1, max_size=20))
def test_frames_survive_any_split(payloads: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(frame(p) for p in payloads)
    dec = FrameDecoder(1000)
    got: list[bytes] = []
    pos = 0
    i = 0
    while pos < len(stream):
        step = cuts[i % len(cuts)]
        got += dec.feed(stream[pos : pos + step])
        pos += step
        i += 1
    assert got == payloads
    assert dec.buffered == 0


def test_oversized_and_negative_frames_raise() -> None:
    with pytest.raises(FrameError):
        FrameDecoder(100).feed(struct.pack(">i", 101))
    with pytest.raises(FrameError):
        FrameDecoder(100).feed(struct.pack(">i", -1))
    assert FrameDecoder(100).feed(struct.pack(">i", 100)) == []


def test_request_header_parse_and_tagged_fields() -> None:
    raw = struct.pack(">hhih", 3, 12, 77, 4) + b"rdka" + b"\x02\x01\x02ab\x05\x00" + b"BODY"
    header, pos = parse_request_header(raw)
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (
        3,
        12,
        77,
        "rdka",
    )
    pos = skip_tagged_fields(raw, pos)
    assert raw[pos:] == b"BODY"


def test_null_client_id_and_truncation() -> None:
    header, pos = parse_request_header(struct.pack(">hhih", 18, 0, 1, -1))
    assert header.client_id is None and pos == 10
    with pytest.raises(HeaderError):
        parse_request_header(b"\x00\x01")
    with pytest.raises(HeaderError):
        parse_request_header(struct.pack(">hhih", 18, 0, 1, 50) + b"x")
    with pytest.raises(HeaderError):
        skip_tagged_fields(b"\x01\x01\x09ab", 0)


def test_response_headers() -> None:
    assert response_header(5, False) == b"\x00\x00\x00\x05"
    assert response_header(5, True) == b"\x00\x00\x00\x05\x00"
