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
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from tests.server.test_fetch_fast import TOPIC, TP0, _ask, _open, fetch_frame
from tests.server.test_produce_fast import batch, produce_frame
from tests.support.fast_paths import Off

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


class _NoFastProduce:
    def answer(self, payload: bytearray, now_ms: int) -> None:
        return None


@pytest.fixture
def pair() -> Iterator[tuple[Broker, Broker]]:
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        fast, generic = _open(Path(a), True), _open(Path(b), False)
        generic.fast_produce = _NoFastProduce()  # type: ignore[assignment]
        fast.fast_fetch = fast.fast_fetch.inner  # type: ignore[attr-defined]
        yield fast, generic
        fast.logs.close()
        generic.logs.close()


def _arrive(conn: KafkaConnection, payload: bytearray) -> None:
    data = frame(payload)
    conn.get_buffer(-1)[: len(data)] = data
    conn.buffer_updated(len(data))


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_a_lone_produce_is_answered_inside_the_read_callback(pair: tuple[Broker, Broker]) -> None:
    fast, generic = pair
    request = produce_frame([(TOPIC, [(0, batch(2))])], acks=1)

    async def main() -> None:
        conn = KafkaConnection(fast)
        transport = _Transport()
        conn.transport = transport  # type: ignore[assignment]
        task = conn._task = asyncio.get_running_loop().create_task(conn._process())
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
        conn = KafkaConnection(fast)
        transport = _Transport()
        conn.transport = transport  # type: ignore[assignment]
        task = conn._task = asyncio.get_running_loop().create_task(conn._process())
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
        conn = KafkaConnection(fast)
        transport = _Transport()
        conn.transport = transport  # type: ignore[assignment]
        task = conn._task = asyncio.get_running_loop().create_task(conn._process())
        await _settle()
        _arrive(conn, request)
        assert not transport.writes  # not taken inline: _process answers it on its turn
        await _settle()
        assert transport.writes == [await _ask(generic, request)]
        conn.abort()
        await task

    asyncio.run(main())
