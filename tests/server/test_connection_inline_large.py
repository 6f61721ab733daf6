"""A bulk Produce (a frame of LARGE_FRAME bytes and more) is answered from the read callback too
(s21): the frame's body arrives over several reads into its own buffer, the read that completes
it answers it with the generic path's bytes, and the buffer goes back to the framer's free-list
for the next large frame. What the fast path declines, and a large frame behind answers already
gathered in the same read, still go to ``_process``, in request order.
"""

from __future__ import annotations

import asyncio
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.server.test_connection_inline import _connected, _NoFastProduce, _settle
from tests.server.test_fetch_fast import TOPIC, TP0, _ask, _open
from tests.server.test_produce_fast import batch, produce_frame

from exactly.protocol.framing import HEAD_READ, LARGE_FRAME, frame
from exactly.server.broker import Broker
from exactly.server.connection import KafkaConnection


@pytest.fixture
def pair() -> Iterator[tuple[Broker, Broker]]:
    """A broker with the fast paths and its twin without the Produce one (as test_connection_inline)."""
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        fast, generic = _open(Path(a), True), _open(Path(b), False)
        generic.fast_produce = _NoFastProduce()  # type: ignore[assignment]
        yield fast, generic
        fast.logs.close()
        generic.logs.close()


def _large(correlation_id: int, records: int = 800) -> bytearray:
    request = produce_frame([(TOPIC, [(0, batch(records))])], acks=-1, correlation_id=correlation_id)
    assert len(request) >= LARGE_FRAME
    return request


def _arrive_in_reads(conn: KafkaConnection, data: bytes, first: int = HEAD_READ) -> list[int]:
    """``data`` delivered as the socket does: a head read, then reads of what the buffer offers;
    returns how many frames were still queued after each read."""
    view = memoryview(data)
    pos, size, queued = 0, first, []
    while pos < len(data):
        buf = conn.get_buffer(-1)
        n = min(len(buf), len(data) - pos, size)
        buf[:n] = view[pos : pos + n]
        buf.release()
        conn.buffer_updated(n)
        queued.append(len(conn._frames))
        pos += n
        size = 128 * 1024
    return queued


def test_a_large_produce_is_answered_in_the_read_that_completes_it(pair: tuple[Broker, Broker]) -> None:
    fast, generic = pair
    first, second = _large(41), _large(42)

    async def main() -> None:
        conn, transport, task = _connected(fast)
        await _settle()
        queued = _arrive_in_reads(conn, frame(first))
        assert queued[-1] == 0 and len(transport.writes) == 1  # answered in the last read's call
        assert transport.writes[0] == await _ask(generic, first)
        assert fast.metrics.bytes_in == len(first) + 4
        # the frame's buffer is back on the free-list and is the next large frame's buffer
        assert len(conn.framer._free) == 1
        released = id(conn.framer._free[0])  # (an id: a reference would keep it from reuse)
        _arrive_in_reads(conn, frame(second))
        assert transport.writes[1] == await _ask(generic, second)
        # taken for the second frame, given back again
        assert [id(b) for b in conn.framer._free] == [released]
        plog = fast.logs.get_partition(TP0)
        want = generic.logs.get_partition(TP0)
        assert plog is not None and want is not None
        assert plog.log_end_offset == want.log_end_offset
        conn.abort()
        await task

    asyncio.run(main())


def test_a_large_produce_the_fast_path_declines_is_answered_by_process(pair: tuple[Broker, Broker]) -> None:
    fast, generic = pair
    bad = _large(51)
    crc_at = len(bad) - 3 - (len(batch(800)) - 17)  # the batch's CRC field
    struct.pack_into(">I", bad, crc_at, struct.unpack_from(">I", bad, crc_at)[0] ^ 1)
    plog = fast.logs.get_partition(TP0)
    assert plog is not None

    async def main() -> None:
        conn, transport, task = _connected(fast)
        await _settle()
        end = plog.log_end_offset
        _arrive_in_reads(conn, frame(bad))
        assert not transport.writes  # declined in the callback: nothing written, nothing appended
        assert plog.log_end_offset == end
        await _settle()
        assert transport.writes == [await _ask(generic, bad)]  # CORRUPT_MESSAGE, as generic
        assert plog.log_end_offset == end
        conn.abort()
        await task

    asyncio.run(main())


def test_a_large_produce_behind_gathered_answers_goes_to_process_in_order(
    pair: tuple[Broker, Broker],
) -> None:
    """A small Produce and a large one in one read: the small one answered inline and written
    before the large one is handled (``_process``), so answers keep request order."""
    fast, generic = pair
    small = produce_frame([(TOPIC, [(0, batch(2))])], acks=1, correlation_id=61)
    large = _large(62)

    async def main() -> None:
        conn, transport, task = _connected(fast)
        await _settle()
        data = frame(small) + frame(large)
        conn.get_buffer(-1)[: len(data)] = data  # the small buffer holds both
        conn.buffer_updated(len(data))
        assert transport.writes == [await _ask(generic, small)]
        assert len(conn._frames) == 1
        await _settle()
        assert transport.writes[1:] == [await _ask(generic, large)]
        conn.abort()
        await task

    asyncio.run(main())
