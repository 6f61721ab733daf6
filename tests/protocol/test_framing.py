"""The framer the broker runs: whole frames in order however the bytes are split, large frames
in buffers of their own that are reused once answered, oversized and negative sizes refused."""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.support.framer import feed, feed_chunks

from exactly.protocol.framing import (
    FREE_BUFFERS,
    FREE_BYTES,
    HEAD_READ,
    LARGE_FRAME,
    SMALL_BUFFER,
    FrameError,
    Framer,
    frame,
)
from exactly.protocol.header import HeaderError, parse_request_header, response_header, skip_tagged_fields
from exactly.protocol.primitives import WireFormatError


@given(st.lists(st.binary(max_size=300), max_size=8), st.lists(st.integers(1, 50), min_size=1, max_size=20))
def test_frames_survive_any_split(payloads: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(frame(p) for p in payloads)
    framer = Framer(1000)
    chunks, pos, i = [], 0, 0
    while pos < len(stream):
        chunks.append(stream[pos : pos + cuts[i % len(cuts)]])
        pos += cuts[i % len(cuts)]
        i += 1
    feed_chunks(framer, chunks)
    assert [bytes(f) for f in framer.frames] == payloads
    assert not framer.receiving_large


@pytest.mark.parametrize("seed", range(5))
def test_small_and_large_frames_in_order_for_any_split(seed: int) -> None:
    rng = random.Random(seed)
    sizes = [
        rng.choice([0, 1, 50, 1000, LARGE_FRAME - 1, LARGE_FRAME, SMALL_BUFFER + 5, 1_200_000])
        for _ in range(30)
    ]
    payloads = [bytes([i % 251]) * s for i, s in enumerate(sizes)]
    framer = Framer(10 * 1024 * 1024)
    feed(framer, b"".join(frame(p) for p in payloads), rng)
    assert [bytes(f) for f in framer.frames] == payloads
    assert all(isinstance(f, bytearray) for f in framer.frames)  # writable: produce patches in place


def test_a_frame_shares_no_memory_with_the_read_buffer() -> None:
    framer = Framer()
    feed_chunks(framer, [frame(b"first") + frame(b"second")[:3]])
    first = framer.frames.popleft()
    feed_chunks(framer, [frame(b"second")[3:] + frame(b"third")])
    assert first == b"first" and [bytes(f) for f in framer.frames] == [b"second", b"third"]


def test_oversized_and_negative_sizes_raise_and_the_framer_stays_broken() -> None:
    framer = Framer(100)
    feed_chunks(framer, [frame(b"x" * 100)])  # the limit itself is allowed
    assert len(framer.frames) == 1
    with pytest.raises(FrameError, match="101"):
        feed_chunks(framer, [struct.pack(">i", 101)])
    with pytest.raises(FrameError):
        feed_chunks(framer, [frame(b"ok")])
    with pytest.raises(FrameError, match="-1"):
        feed_chunks(Framer(100), [struct.pack(">i", -1)])


def test_a_large_frame_is_received_into_its_own_buffer() -> None:
    framer = Framer()
    payload = bytes(range(256)) * 1000
    stream = frame(payload)
    feed_chunks(framer, [stream[:1000]])
    assert framer.receiving_large and not framer.frames
    view = framer.get_buffer(-1)
    assert len(view) == len(stream) - 1000  # exactly the rest of this frame
    feed_chunks(framer, [stream[1000:]])
    assert not framer.receiving_large and bytes(framer.frames.popleft()) == payload


def test_after_a_large_frame_only_a_head_is_read_into_the_small_buffer() -> None:
    """A producer's large requests follow each other: once one is whole, the next read is offered
    HEAD_READ bytes, so at most that much of the next large frame is copied out of the small
    buffer; the rest goes straight into the frame's own buffer. A small frame ends this."""
    framer = Framer()
    first, second = bytes(range(256)) * 300, bytes(reversed(range(256))) * 1200
    assert LARGE_FRAME <= len(first) < SMALL_BUFFER  # large, though it arrives whole in the small buffer
    feed_chunks(framer, [frame(first)])
    assert len(framer.get_buffer(-1)) == HEAD_READ
    stream = frame(second) + frame(b"small") + frame(b"next")
    feed_chunks(framer, [stream[:HEAD_READ]])
    assert framer.receiving_large
    assert len(framer.get_buffer(-1)) == len(frame(second)) - HEAD_READ  # the rest of it, directly
    feed_chunks(framer, [stream[HEAD_READ : len(frame(second))]])
    assert len(framer.get_buffer(-1)) == HEAD_READ
    feed_chunks(framer, [stream[len(frame(second)) :]])
    assert [bytes(f) for f in framer.frames] == [first, second, b"small", b"next"]
    assert len(framer.get_buffer(-1)) == SMALL_BUFFER  # whole again: every byte was framed


def test_spare_buffer_is_resized_and_filled_whole() -> None:
    """A released buffer is reused for the next large frame, resized: it must come out whole,
    byte for byte, whatever the size sequence."""
    rng = random.Random(3)
    framer = Framer(10 * 1024 * 1024)
    sizes = [1_000_000, 990_000, 1_050_000, LARGE_FRAME, 1_000_000, 3_000_000, 200_000]
    reused = 0
    previous: set[int] = set()
    for i, size in enumerate(sizes):
        payload = bytes([(i * 37 + j) % 251 for j in range(251)]) * (size // 251) + b"x" * (size % 251)
        feed(framer, frame(payload), rng)
        got = framer.frames.popleft()
        assert isinstance(got, bytearray) and bytes(got) == payload
        reused += id(got) in previous
        previous = {id(b) for b in framer._free} | {id(got)}
        framer.release(got)  # as the connection does once the request is answered and unreferenced
        del got
    assert reused >= 3


def test_released_buffers_are_taken_back_resized() -> None:
    framer = Framer()
    bufs = [bytearray(1_000_000 - i * 1000) for i in range(3)]
    ids = {id(b) for b in bufs}
    for b in bufs:
        framer.release(b)
    del bufs, b
    for size in (990_000, 999_000, 1_000_500):  # each taken from the free-list, resized
        buf = framer._large_buffer(size)
        assert len(buf) == size and id(buf) in ids
    assert framer._free == [] and framer._free_bytes == 0


def test_free_list_is_bounded() -> None:
    framer = Framer()
    for i in range(FREE_BUFFERS + 3):
        framer.release(bytearray(LARGE_FRAME + i * 1000))
    assert len(framer._free) == FREE_BUFFERS
    # the largest ones are kept
    assert sorted(len(b) for b in framer._free) == [
        LARGE_FRAME + i * 1000 for i in range(3, FREE_BUFFERS + 3)
    ]
    big = 3 * 1024 * 1024
    for _ in range(4):
        framer.release(bytearray(big))
    assert framer._free_bytes <= FREE_BYTES
    assert framer._free_bytes == sum(b.__alloc__() for b in framer._free)
    framer.release(bytearray(LARGE_FRAME - 1))  # small frames live in the shared read buffer
    assert all(len(b) >= LARGE_FRAME for b in framer._free)


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
    with pytest.raises(WireFormatError):
        skip_tagged_fields(b"\x01\x01\x09ab", 0)


def test_response_headers() -> None:
    assert response_header(5, False) == b"\x00\x00\x00\x05"
    assert response_header(5, True) == b"\x00\x00\x00\x05\x00"
