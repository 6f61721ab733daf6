"""KafkaConnection gathers the responses of pipelined requests into one ``writelines`` but must
keep them in request order, send what is done before a request that may park (a long-polling
Fetch), skip requests without a response (acks=0), and hand answered large-frame buffers back to
the framer's free-list only when nothing else references them."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from tests.support.fast_paths import Off

from exactly.protocol.apis import ApiKey
from exactly.protocol.framing import LARGE_FRAME, frame
from exactly.server import request_task as task_mod
from exactly.server.connection import KafkaConnection
from exactly.server.deferred_response import Deferred, PendingAnswer


@dataclass
class _Metrics:
    bytes_in: int = 0


@dataclass
class _Broker:
    max_request_size: int = 64 * 1024 * 1024
    connections: set = field(default_factory=set)
    metrics: _Metrics = field(default_factory=_Metrics)
    replicas: None = None  # single broker: no cluster replica manager
    # the fast paths decline every frame: the fake ``dispatch`` answers them all
    fast_produce: Off = field(default_factory=Off)
    fast_fetch: Off = field(default_factory=Off)


@dataclass
class _Transport:
    writes: list[list[bytes]] = field(default_factory=list)
    closed: bool = False

    def writelines(self, chunks: list[bytes]) -> None:
        self.writes.append([bytes(c) for c in chunks])

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


PARKING_PRODUCE = 100  # fake produce tags from here on park like an acks=all produce in a cluster
DEFERRING_PRODUCE = 200  # from here on: a Deferred answer (appended, waiting for the ISR)


def _request(key: int, tag: int, size: int = 16) -> bytearray:
    body = struct.pack(">hhi", key, 0, tag)
    return bytearray(body + bytes(max(size - len(body), 0)))


def _arrive(conn: KafkaConnection, payload: bytearray) -> None:
    """``payload`` arrives from the socket in one read."""
    data = frame(payload)
    conn.get_buffer(-1)[: len(data)] = data
    conn.buffer_updated(len(data))


def _make(monkeypatch: pytest.MonkeyPatch, park: asyncio.Future[None] | None = None) -> tuple[Any, Any, list]:
    """A connection whose dispatch answers ``b"r<tag>"``, nothing for tag < 0 (acks=0), and
    parks Fetch requests on ``park``; returns (connection, transport, log of dispatch starts)."""
    started: list[tuple[int, int]] = []
    transport = _Transport()

    async def fake_dispatch(
        broker: Any,
        payload: bytearray,
        peer: str,
        before_park: Callable[[], None] = lambda: None,
        may_defer: bool = False,
        file_slices: bool = False,
        principal: str = "User:ANONYMOUS",
        listener: str = "PLAINTEXT",
        *,
        fast_paths: bool = True,
    ) -> list[bytes] | None:
        key, _version, tag = struct.unpack_from(">hhi", payload)
        started.append((tag, len(transport.writes)))
        if key == ApiKey.FETCH and park is not None:
            await park
        if key == ApiKey.PRODUCE and tag >= DEFERRING_PRODUCE and park is not None and may_defer:
            waiting = park

            async def answer() -> list[bytes]:
                await waiting
                return [b"r%d" % tag]

            return Deferred(answer())  # type: ignore[return-value]
        if key == ApiKey.PRODUCE and tag >= PARKING_PRODUCE and park is not None:
            before_park()  # as an acks=all produce does before it waits for the ISR
            await park
        return None if tag < 0 else [b"r%d" % tag]

    monkeypatch.setattr(task_mod, "dispatch", fake_dispatch)
    conn = KafkaConnection(_Broker())  # type: ignore[arg-type]
    conn.transport = transport  # type: ignore[assignment]
    return conn, transport, started


def test_pipelined_responses_are_written_together_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        conn, transport, _ = _make(monkeypatch)
        for tag in (1, 2, -3, 4):  # -3: acks=0 produce, no response
            conn._frames.append(_request(ApiKey.PRODUCE, tag))
        task = conn._task = asyncio.get_running_loop().create_task(conn._process())
        await asyncio.sleep(0.01)
        assert transport.writes == [[b"r1", b"r2", b"r4"]]
        _arrive(conn, _request(ApiKey.METADATA, 5))  # arrives alone: answered alone
        await asyncio.sleep(0.01)
        assert transport.writes == [[b"r1", b"r2", b"r4"], [b"r5"]]
        conn.abort()
        await task

    asyncio.run(main())


def test_small_answers_go_out_before_a_large_frame_is_handled(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        conn, transport, started = _make(monkeypatch)
        conn._frames.extend(
            [
                _request(ApiKey.METADATA, 1),
                _request(ApiKey.PRODUCE, 2),
                _request(ApiKey.PRODUCE, 3, LARGE_FRAME),
                _request(ApiKey.PRODUCE, 4),
            ]
        )
        task = conn._task = asyncio.get_running_loop().create_task(conn._process())
        await asyncio.sleep(0.01)
        assert transport.writes == [[b"r1", b"r2"], [b"r3", b"r4"]]
        assert (3, 1) in started  # r1, r2 were sent before the large produce was handled
        conn.abort()
        await task

    asyncio.run(main())


def test_finished_responses_go_out_before_a_request_that_may_park(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        park: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        conn, transport, started = _make(monkeypatch, park)
        conn._frames.extend(
            [
                _request(ApiKey.PRODUCE, 1),
                _request(ApiKey.PRODUCE, 2),
                _request(ApiKey.FETCH, 3),
                _request(ApiKey.PRODUCE, 4),
            ]
        )
        task = conn._task = asyncio.get_running_loop().create_task(conn._process())
        await asyncio.sleep(0.01)
        # the fetch started only after r1, r2 were written; r4 waits behind the parked fetch
        assert (3, 1) in started
        assert transport.writes == [[b"r1", b"r2"]]
        park.set_result(None)
        await asyncio.sleep(0.01)
        flat = [c for w in transport.writes for c in w]
        assert flat == [b"r1", b"r2", b"r3", b"r4"]
        conn.abort()
        await task

    asyncio.run(main())


def test_held_responses_go_out_when_a_produce_parks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A produce is handled with earlier answers held back (most do not wait: acks=1, or an ISR
    of one); one that parks for the ISR writes them first, so they never wait for replication."""

    async def main() -> None:
        park: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        conn, transport, started = _make(monkeypatch, park)
        conn._frames.extend(
            [
                _request(ApiKey.PRODUCE, 1),
                _request(ApiKey.PRODUCE, 2),
                _request(ApiKey.PRODUCE, PARKING_PRODUCE),
                _request(ApiKey.PRODUCE, 4),
            ]
        )
        task = conn._task = asyncio.get_running_loop().create_task(conn._process())
        await asyncio.sleep(0.01)
        assert (PARKING_PRODUCE, 0) in started  # handled with r1, r2 still held back
        assert transport.writes == [[b"r1", b"r2"]]  # written when it parked
        park.set_result(None)
        await asyncio.sleep(0.01)
        flat = [c for w in transport.writes for c in w]
        assert flat == [b"r1", b"r2", b"r%d" % PARKING_PRODUCE, b"r4"]
        conn.abort()
        await task

    asyncio.run(main())


def test_answered_large_buffers_are_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        conn, transport, _ = _make(monkeypatch)
        frames = [_request(ApiKey.PRODUCE, i, 1_000_000 - i * 1000) for i in range(3)]
        ids = {id(f) for f in frames}
        conn._frames.extend(frames)
        del frames
        task = conn._task = asyncio.get_running_loop().create_task(conn._process())
        await asyncio.sleep(0.01)
        # large frames take long to handle: their answers are not held back for the next one
        assert transport.writes == [[b"r0"], [b"r1"], [b"r2"]]
        assert {id(b) for b in conn.framer._free} == ids  # all three were answered and kept
        for size in (990_000, 999_000, 1_000_500):  # each taken from the free-list, resized
            buf = conn.framer._large_buffer(size)
            assert len(buf) == size and id(buf) in ids
        assert conn.framer._free == [] and conn.framer._free_bytes == 0
        conn.abort()
        await task

    asyncio.run(main())


def test_referenced_buffer_is_not_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A handler that keeps a memoryview into its frame (a produce request's records) must not
    see that frame overwritten by the next request."""
    kept: list[memoryview] = []

    async def keeping_dispatch(
        broker: Any,
        payload: bytearray,
        peer: str,
        before_park: Callable[[], None] = lambda: None,
        may_defer: bool = False,
        file_slices: bool = False,
        **_: Any,
    ) -> list[bytes] | None:
        kept.append(memoryview(payload))
        return [b"ok"]

    async def main() -> None:
        conn, _transport, _ = _make(monkeypatch)
        monkeypatch.setattr(task_mod, "dispatch", keeping_dispatch)
        conn._frames.append(_request(ApiKey.PRODUCE, 1, 200_000))
        task = conn._task = asyncio.get_running_loop().create_task(conn._process())
        await asyncio.sleep(0.01)
        assert conn.framer._free == []
        conn.abort()
        await task

    asyncio.run(main())


def test_drain_answers_the_request_in_hand_then_closes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cluster shutdown: a parked request (an acks=all produce about to be answered
    NOT_LEADER_OR_FOLLOWER) is answered and written, requests not started are dropped, and the
    connection closes after its writes; ``drain`` returns once the connection is gone."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        park: asyncio.Future[None] = loop.create_future()
        conn, transport, started = _make(monkeypatch, park)
        conn._lost = loop.create_future()
        conn._frames.extend(
            [_request(ApiKey.PRODUCE, 1), _request(ApiKey.FETCH, 2), _request(ApiKey.PRODUCE, 3)]
        )
        task = conn._task = loop.create_task(conn._process())
        await asyncio.sleep(0.01)
        draining = loop.create_task(conn.drain())
        await asyncio.sleep(0.01)
        assert not transport.closed  # the parked request is still owed its answer
        park.set_result(None)
        await asyncio.sleep(0.01)
        assert [c for w in transport.writes for c in w] == [b"r1", b"r2"]
        assert [tag for tag, _ in started] == [1, 2] and transport.closed
        assert not draining.done()  # until the transport reports the connection lost
        conn.connection_lost(None)
        await asyncio.wait_for(draining, 1)
        await task

    asyncio.run(main())


async def _settle() -> None:
    """Let every ready callback and task run (no clock involved)."""
    for _ in range(50):
        await asyncio.sleep(0)


def test_produces_are_handled_while_earlier_ones_wait_for_the_isr(monkeypatch: pytest.MonkeyPatch) -> None:
    """A deferred acks=all produce lets the next Produce in; any other API waits until the
    deferred answers are out; every answer goes out in request order."""

    async def main() -> None:
        park: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        conn, transport, started = _make(monkeypatch, park)
        conn._frames.extend(
            [
                _request(ApiKey.PRODUCE, 1),
                _request(ApiKey.PRODUCE, DEFERRING_PRODUCE),
                _request(ApiKey.PRODUCE, DEFERRING_PRODUCE + 1),
                _request(ApiKey.PRODUCE, 3),
                _request(ApiKey.METADATA, 4),
                _request(ApiKey.PRODUCE, 5),
            ]
        )
        task = conn._task = asyncio.get_running_loop().create_task(conn._process())
        await _settle()
        assert [tag for tag, _ in started] == [1, DEFERRING_PRODUCE, DEFERRING_PRODUCE + 1, 3]
        assert transport.writes == [[b"r1"]]  # r3 is done but owed after the deferred two
        assert conn.idle_for(1e12) == 0.0  # answers still owed: not idle
        park.set_result(None)
        await _settle()
        assert [tag for tag, _ in started] == [1, DEFERRING_PRODUCE, DEFERRING_PRODUCE + 1, 3, 4, 5]
        flat = [c for w in transport.writes for c in w]
        assert flat == [b"r1", b"r200", b"r201", b"r3", b"r4", b"r5"]
        assert not conn._deferred
        conn.abort()
        await task

    asyncio.run(main())


def test_no_more_than_max_deferred_produces_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        park: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        conn, transport, started = _make(monkeypatch, park)
        monkeypatch.setattr(task_mod, "MAX_DEFERRED", 2)
        conn._frames.extend([_request(ApiKey.PRODUCE, DEFERRING_PRODUCE + i) for i in range(3)])
        task = conn._task = asyncio.get_running_loop().create_task(conn._process())
        await _settle()
        assert [tag for tag, _ in started] == [DEFERRING_PRODUCE, DEFERRING_PRODUCE + 1]
        park.set_result(None)
        await _settle()
        assert [c for w in transport.writes for c in w] == [b"r200", b"r201", b"r202"]
        conn.abort()
        await task

    asyncio.run(main())


def test_a_closed_connection_cancels_its_deferred_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        park: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        conn, transport, _ = _make(monkeypatch, park)
        conn._frames.append(_request(ApiKey.PRODUCE, DEFERRING_PRODUCE))
        task = conn._task = asyncio.get_running_loop().create_task(conn._process())
        await _settle()
        waiting = list(conn._deferred)
        assert len(waiting) == 1 and not waiting[0].done()
        conn.connection_lost(None)
        await task
        await _settle()
        assert waiting[0].cancelled() and not conn._deferred
        assert transport.writes == []

    asyncio.run(main())


def test_drain_waits_for_the_deferred_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        park: asyncio.Future[None] = loop.create_future()
        conn, transport, _ = _make(monkeypatch, park)
        conn._lost = loop.create_future()
        conn._frames.extend([_request(ApiKey.PRODUCE, DEFERRING_PRODUCE), _request(ApiKey.PRODUCE, 1)])
        task = conn._task = loop.create_task(conn._process())
        await _settle()
        draining = loop.create_task(conn.drain())
        await _settle()
        assert not transport.closed and transport.writes == []
        park.set_result(None)
        await _settle()
        assert [c for w in transport.writes for c in w] == [b"r200", b"r1"] and transport.closed
        conn.connection_lost(None)
        await asyncio.wait_for(draining, 1)
        await task

    asyncio.run(main())


def test_an_answer_resolved_by_a_call_is_written_in_that_call_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A deferred answer that is a ``PendingAnswer`` (an acks=all produce's) goes to the socket
    inside the call that resolves it (the follower fetch that moved the HW), not loop hops later;
    one resolved ahead of an earlier one waits for it; one still pending when the connection goes
    is cancelled, which releases what waited to resolve it."""
    answers: dict[int, PendingAnswer[list[bytes]]] = {}

    async def fake_dispatch(broker: Any, payload: bytearray, *args: Any, **kwargs: Any) -> Any:
        _key, _version, tag = struct.unpack_from(">hhi", payload)
        answers[tag] = PendingAnswer()
        return Deferred(answers[tag])

    async def main() -> None:
        monkeypatch.setattr(task_mod, "dispatch", fake_dispatch)
        conn = KafkaConnection(_Broker())  # type: ignore[arg-type]
        transport = _Transport()
        conn.transport = transport  # type: ignore[assignment]
        conn._frames.extend(
            [_request(ApiKey.PRODUCE, 1), _request(ApiKey.PRODUCE, 2), _request(ApiKey.PRODUCE, 3)]
        )
        task = conn._task = asyncio.get_running_loop().create_task(conn._process())
        await asyncio.sleep(0.01)
        assert sorted(answers) == [1, 2, 3] and transport.writes == []
        answers[2].set_result([b"r2"])
        assert transport.writes == []  # behind the answer to request 1
        answers[1].set_result([b"r1"])
        assert transport.writes == [[b"r1", b"r2"]]  # written inside set_result, in order
        released: list[int] = []
        answers[3].on_cancel(lambda: released.append(3))
        conn.abort()
        await task
        assert released == [3]
        answers[3].set_result([b"r3"])  # too late: nothing is written
        assert transport.writes == [[b"r1", b"r2"]]

    asyncio.run(main())


def test_an_answer_resolved_by_a_call_is_checked_once_and_a_none_answer_keeps_process_parked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``_answered`` asks the head ``done()`` once per answer it takes (s19: it asked twice), and
    a head resolved with nothing to send (None) is taken without waking ``_process`` when no
    frame waits, as a written one is."""
    checks: list[int] = []

    class Counted(PendingAnswer[list[bytes] | None]):
        __slots__ = ()

        def done(self) -> bool:
            checks.append(1)
            return super().done()

    answers: dict[int, Counted] = {}

    async def fake_dispatch(broker: Any, payload: bytearray, *args: Any, **kwargs: Any) -> Any:
        _key, _version, tag = struct.unpack_from(">hhi", payload)
        answers[tag] = Counted()
        return Deferred(answers[tag])

    async def main() -> None:
        monkeypatch.setattr(task_mod, "dispatch", fake_dispatch)
        conn = KafkaConnection(_Broker())  # type: ignore[arg-type]
        transport = _Transport()
        conn.transport = transport  # type: ignore[assignment]
        conn._frames.append(_request(ApiKey.PRODUCE, 1))
        task = conn._task = asyncio.get_running_loop().create_task(conn._process())
        await _settle()
        wakeup = conn._wakeup
        assert wakeup is not None and not wakeup.done() and conn._idle
        checks.clear()
        answers[1].set_result([b"r1"])
        assert transport.writes == [[b"r1"]] and not conn._deferred
        assert len(checks) == 1  # one answer taken, one done() asked
        assert not wakeup.done()  # nothing else to do: _process stays parked
        conn._frames.append(_request(ApiKey.PRODUCE, 2))
        conn._wake()
        await _settle()
        wakeup = conn._wakeup
        assert wakeup is not None and not wakeup.done() and sorted(answers) == [1, 2]
        answers[2].set_result(None)  # nothing to send (an acks=0 answer's shape)
        assert transport.writes == [[b"r1"]] and not conn._deferred
        assert not wakeup.done()  # taken here, _process not woken for it
        conn.abort()
        await task

    asyncio.run(main())
