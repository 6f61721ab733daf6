"""KafkaConnection answers a lone frame that a fast path takes whole from its read callback
(``dispatch.fast_answer``), and a parked fast-path Fetch holds back the requests behind it.

A real broker behind a connection with a recording transport: the answers written must be the
ones the generic path gives (a twin broker with the fast paths off, asked through ``dispatch``),
written inside ``buffer_updated`` for a lone Produce, and in request order when a Produce arrives
behind a parked Fetch on the same connection (which is not handled before the Fetch answered, as
with the generic path's awaited Fetch).
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass, field
from typing import Any

import pytest
from tests.server.test_fetch_fast import TOPIC, TP0, _ask, fetch_frame, fill_events
from tests.server.test_produce_fast import batch, produce_frame
from tests.support.fast_paths import MakePair, Off, fetch_pair_fixture  # noqa: F401  (fixture: fetch_pair)

from exactly.protocol.framing import frame
from exactly.server.broker import Broker
from exactly.server.connection import KafkaConnection


@dataclass
class _Transport:
    writes: list[bytes] = field(default_factory=list)
    closed: bool = False

    def writelines(self, chunks: list[Any]) -> None:
        self.writes.append(b"".join(bytes(c) for c in chunks))

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


@pytest.fixture
def pair(fetch_pair: MakePair) -> tuple[Broker, Broker]:
    fast, generic = fetch_pair(fill_events, generic_produce_off=True)
    fast.fast_fetch = fast.fast_fetch.inner  # type: ignore[attr-defined]
    return fast, generic


def _arrive(conn: KafkaConnection, payload: bytearray) -> None:
    data = frame(payload)
    conn.get_buffer(-1)[: len(data)] = data
    conn.buffer_updated(len(data))


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def _connected(broker: Broker) -> tuple[KafkaConnection, _Transport, asyncio.Task[None]]:
    """A connection to ``broker`` on a recording transport, its request task started."""
    conn = KafkaConnection(broker)
    transport = _Transport()
    conn.transport = transport  # type: ignore[assignment]
    task = conn._task = asyncio.get_running_loop().create_task(conn._process())
    return conn, transport, task


def test_a_lone_produce_is_answered_inside_the_read_callback(pair: tuple[Broker, Broker]) -> None:
    fast, generic = pair
    request = produce_frame([(TOPIC, [(0, batch(2))])], acks=1)

    async def main() -> None:
        conn, transport, task = _connected(fast)
        await _settle()  # _process waits for a frame
        _arrive(conn, request)
        assert len(transport.writes) == 1  # written in the call, before any task ran
        assert transport.writes[0] == await _ask(generic, request)
        assert fast.metrics.bytes_in == len(request) + 4
        conn.abort()
        await task

    asyncio.run(main())


def test_a_produce_behind_a_parked_fetch_waits_for_its_answer(pair: tuple[Broker, Broker]) -> None:
    fast, generic = pair
    plog = fast.logs.get_partition(TP0)
    assert plog is not None
    fetch = fetch_frame([(TOPIC, [(0, plog.log_end_offset)])], max_wait_ms=100)
    produce = produce_frame([(TOPIC, [(0, batch(2))])], acks=1)

    async def main() -> None:
        conn, transport, task = _connected(fast)
        await _settle()
        end = plog.log_end_offset
        _arrive(conn, fetch)  # parks (nothing past the end)
        assert conn._deferred and not transport.writes
        _arrive(conn, produce)
        await _settle()
        assert plog.log_end_offset == end  # not handled while the Fetch waits
        for _ in range(100):
            if len(transport.writes) == 2:
                break
            await asyncio.sleep(0.01)
        # the Fetch ran out its max_wait with nothing, then the Produce went in
        want_fetch = await _ask(generic, fetch)
        want_produce = await _ask(generic, produce)
        assert transport.writes == [want_fetch, want_produce]
        assert plog.log_end_offset == end + 2
        conn.abort()
        await task

    asyncio.run(main())


def test_frames_the_fast_paths_decline_go_through_process(pair: tuple[Broker, Broker]) -> None:
    fast, generic = pair
    fast.fast_fetch = Off()  # type: ignore[assignment]
    request = fetch_frame([(TOPIC, [(0, 0)])])

    async def main() -> None:
        conn, transport, task = _connected(fast)
        await _settle()
        _arrive(conn, request)
        assert not transport.writes  # not taken inline: _process answers it on its turn
        await _settle()
        assert transport.writes == [await _ask(generic, request)]
        conn.abort()
        await task

    asyncio.run(main())


def _joined(writes: list[bytes]) -> bytes:
    return b"".join(writes)


def test_several_fast_frames_of_one_read_are_answered_inline_in_one_write(
    pair: tuple[Broker, Broker],
) -> None:
    """Two Produces and a Fetch arriving in one read (pipelined): all three answered inside the
    read callback, in request order, with one write, byte for byte what the generic path gives."""
    fast, generic = pair
    plog = fast.logs.get_partition(TP0)
    assert plog is not None
    first = produce_frame([(TOPIC, [(0, batch(2))])], acks=1, correlation_id=11)
    second = produce_frame([(TOPIC, [(0, batch(3))])], acks=-1, correlation_id=12)
    fetch = fetch_frame([(TOPIC, [(0, plog.log_end_offset)])], max_wait_ms=0)

    async def main() -> None:
        conn, transport, task = _connected(fast)
        await _settle()
        data = frame(first) + frame(second) + frame(fetch)
        conn.get_buffer(-1)[: len(data)] = data
        conn.buffer_updated(len(data))
        assert not conn._frames  # every frame handled in the call
        want = [await _ask(generic, first), await _ask(generic, second), await _ask(generic, fetch)]
        assert transport.writes == [b"".join(want)]
        assert fast.metrics.bytes_in == len(data)
        await _settle()
        assert len(transport.writes) == 1
        conn.abort()
        await task

    asyncio.run(main())


def test_a_declined_frame_stops_the_inline_answers_and_process_keeps_the_order(
    pair: tuple[Broker, Broker],
) -> None:
    """Produce, a frame the fast paths decline (Metadata), Produce in one read: the first is
    answered inline, the other two only by ``_process``, in order (the second Produce is not
    appended before the Metadata is answered)."""
    fast, generic = pair
    plog = fast.logs.get_partition(TP0)
    assert plog is not None
    first = produce_frame([(TOPIC, [(0, batch(2))])], acks=1, correlation_id=21)
    metadata = _metadata_frame(22)
    last = produce_frame([(TOPIC, [(0, batch(1))])], acks=1, correlation_id=23)

    async def main() -> None:
        conn, transport, task = _connected(fast)
        await _settle()
        end = plog.log_end_offset
        data = frame(first) + frame(metadata) + frame(last)
        conn.get_buffer(-1)[: len(data)] = data
        conn.buffer_updated(len(data))
        want_first = await _ask(generic, first)
        assert transport.writes == [want_first]  # written in the call
        assert plog.log_end_offset == end + 2  # the last Produce waits behind the Metadata
        assert len(conn._frames) == 2
        await _settle()
        want = [want_first, await _ask(generic, metadata), await _ask(generic, last)]
        assert _joined(transport.writes) == b"".join(want)
        assert plog.log_end_offset == end + 3
        conn.abort()
        await task

    asyncio.run(main())


def test_a_parked_fetch_in_a_read_holds_back_the_frames_behind_it(pair: tuple[Broker, Broker]) -> None:
    """Produce, Fetch at the new log end (parks), Produce in one read: the first Produce is
    answered at once, the Fetch parks, and the last Produce is handled only after the Fetch
    answered (its max_wait, nothing new): the generic path's order."""
    fast, generic = pair
    plog = fast.logs.get_partition(TP0)
    assert plog is not None
    first = produce_frame([(TOPIC, [(0, batch(2))])], acks=1, correlation_id=31)
    fetch = fetch_frame([(TOPIC, [(0, plog.log_end_offset + 2)])], max_wait_ms=50)
    last = produce_frame([(TOPIC, [(0, batch(1))])], acks=1, correlation_id=33)

    async def main() -> None:
        conn, transport, task = _connected(fast)
        await _settle()
        end = plog.log_end_offset
        data = frame(first) + frame(fetch) + frame(last)
        conn.get_buffer(-1)[: len(data)] = data
        conn.buffer_updated(len(data))
        want_first = await _ask(generic, first)
        assert transport.writes == [want_first]
        assert conn._deferred and len(conn._frames) == 1
        await _settle()
        assert plog.log_end_offset == end + 2  # not handled while the Fetch waits
        for _ in range(100):
            if len(transport.writes) == 3:
                break
            await asyncio.sleep(0.01)
        want = [want_first, await _ask(generic, fetch), await _ask(generic, last)]
        assert transport.writes == want
        assert plog.log_end_offset == end + 3
        conn.abort()
        await task

    asyncio.run(main())


def _metadata_frame(correlation_id: int) -> bytearray:
    """A Metadata v1 request for every topic (a request no fast path takes)."""
    return bytearray(struct.pack(">hhih", 3, 1, correlation_id, 4) + b"test" + struct.pack(">i", -1))
