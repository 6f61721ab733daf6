"""The consumer Fetch fast path (exactly.server.fetch_fast) against the generic path: the same bytes.

Two in-process brokers hold the same logs (plain records, committed and aborted transactions) and
get the same Fetch frames through ``dispatch`` as a connection passes them (``may_defer``); on one
the fast path is off. Every answer and the request and byte counters must be identical, and the
fast path must have taken exactly the requests of its shape (and declined the rest, which the
generic path then answered: errors, sessions, several partitions, replica fetches). Parked fetches
are woken by the same appends on both brokers, or run out their max_wait.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import pytest
from tests.storage.helpers import append, append_marker
from tests.support.fast_paths import Counting, MakePair, Off, fetch_pair_fixture  # noqa: F401  (fixture: fetch_pair)

from exactly.protocol.apis import ApiKey
from exactly.protocol.primitives import write_uvarint
from exactly.server.broker import Broker
from exactly.server.deferred_response import Deferred, PendingAnswer
from exactly.server.dispatch import CloseConnection, dispatch
from exactly.types import TopicPartition

NOW = 1_700_000_000_000
TOPIC = "events"
TP0 = TopicPartition(TOPIC, 0)


def fetch_frame(
    parts: list[tuple[str, list[tuple[int, int]]]],
    *,
    version: int = 12,
    max_wait_ms: int = 0,
    min_bytes: int = 1,
    max_bytes: int = 50 * 1024 * 1024,
    partition_max_bytes: int = 1024 * 1024,
    isolation: int = 0,
    replica_id: int = -1,
    session: tuple[int, int] = (0, -1),
    forgotten: list[tuple[str, list[int]]] | None = None,
    rack: str = "",
    client_id: str | None = "fetch-test",
    correlation_id: int = 11,
    request_tags: bytes = b"\x00",
) -> bytearray:
    """A Fetch request frame (without its size prefix), written by hand as a client does."""
    flexible = version >= 12
    out = bytearray(struct.pack(">hhi", 1, version, correlation_id))
    out += (
        struct.pack(">h", -1) if client_id is None else struct.pack(">h", len(client_id)) + client_id.encode()
    )
    if flexible:
        out += b"\x00"

    def count(n: int) -> bytes:
        return write_uvarint(n + 1) if flexible else struct.pack(">i", n)

    def string(s: str) -> bytes:
        raw = s.encode()
        return write_uvarint(len(raw) + 1) + raw if flexible else struct.pack(">h", len(raw)) + raw

    out += struct.pack(">iiiib", replica_id, max_wait_ms, min_bytes, max_bytes, isolation)
    if version >= 7:
        out += struct.pack(">ii", *session)
    out += count(len(parts))
    for name, partitions in parts:
        out += string(name)
        out += count(len(partitions))
        for index, offset in partitions:
            out += struct.pack(">i", index)
            if version >= 9:
                out += struct.pack(">i", 0)  # current leader epoch
            out += struct.pack(">q", offset)
            if version >= 12:
                out += struct.pack(">i", -1)  # last fetched epoch
            if version >= 5:
                out += struct.pack(">q", -1)  # log start offset
            out += struct.pack(">i", partition_max_bytes)
            if flexible:
                out += b"\x00"
        if flexible:
            out += b"\x00"
    if version >= 7:
        forgotten = forgotten or []
        out += count(len(forgotten))
        for name, indexes in forgotten:
            out += string(name) + count(len(indexes)) + b"".join(struct.pack(">i", i) for i in indexes)
            if flexible:
                out += b"\x00"
    if version >= 11:
        out += string(rack)
    if flexible:
        out += request_tags
    return out


def _fill(broker: Broker) -> None:
    """The same logs on every broker: plain records, a committed and an aborted transaction."""
    plog = broker.logs.get_partition(TP0)
    assert plog is not None
    append(plog, 3, value_size=200, timestamp=NOW)
    append(plog, 2, value_size=1000, producer_id=7, epoch=0, seq=0, transactional=True)
    append(plog, 1, value_size=300, producer_id=8, epoch=0, seq=0, transactional=True)
    append_marker(plog, 7, 0, abort=False)
    append(plog, 4, value_size=50)
    append_marker(plog, 8, 0, abort=True)
    append(plog, 2, value_size=700, producer_id=9, epoch=0, seq=0, transactional=True)  # open
    other = broker.logs.get_partition(TopicPartition(TOPIC, 1))
    assert other is not None
    append(other, 5, value_size=100)


def fill_events(broker: Broker) -> None:
    """The topics and records of this module's broker pair (``test_connection_inline`` too)."""
    broker.logs.create_topic(TOPIC, 2, {}, now_ms=NOW)
    broker.logs.create_topic("empty", 1, {}, now_ms=NOW)
    _fill(broker)


@pytest.fixture
def pair(fetch_pair: MakePair) -> tuple[Broker, Broker]:
    return fetch_pair(fill_events)


async def _ask(broker: Broker, frame: bytearray) -> Any:
    """What a connection would write for the frame (awaiting a deferred answer)."""
    try:
        result = await dispatch(broker, bytearray(frame), "test", may_defer=True)
    except CloseConnection as exc:
        return ("closed", str(exc))
    if isinstance(result, Deferred):
        answer = result.answer
        result = await answer.wait() if isinstance(answer, PendingAnswer) else await answer
    return None if result is None else b"".join(bytes(c) for c in result)


def _counters(broker: Broker) -> tuple[int, int]:
    return broker.metrics.requests[int(ApiKey.FETCH)], broker.metrics.bytes_out


def _same(pair: tuple[Broker, Broker], frame: bytearray, fast_takes: bool) -> Any:
    fast, generic = pair
    before = fast.fast_fetch.taken  # type: ignore[attr-defined]
    got, want = asyncio.run(_ask(fast, frame)), asyncio.run(_ask(generic, frame))
    assert got == want
    assert _counters(fast) == _counters(generic)
    assert fast.fast_fetch.taken - before == int(fast_takes)  # type: ignore[attr-defined]
    return got


def test_the_pair_is_the_fast_path_against_the_generic_one(pair: tuple[Broker, Broker]) -> None:
    """What every comparison here rests on: same logs, one broker's fast Fetch path counted, the
    other's off (else comparing the two would compare the fast path with itself)."""
    fast, generic = pair
    assert isinstance(fast.fast_fetch, Counting) and isinstance(generic.fast_fetch, Off)
    assert not isinstance(generic.fast_produce, Off)  # this module's generic broker produces normally
    for tp in (TP0, TopicPartition(TOPIC, 1), TopicPartition("empty", 0)):
        a, b = fast.logs.get_partition(tp), generic.logs.get_partition(tp)
        assert a is not None and b is not None
        assert (a.log_end_offset, a.high_watermark) == (b.log_end_offset, b.high_watermark)


@pytest.mark.parametrize("version", range(4, 13))
@pytest.mark.parametrize("isolation", [0, 1])
def test_common_fetch_is_answered_by_the_fast_path_with_the_generic_bytes(
    pair: tuple[Broker, Broker], version: int, isolation: int
) -> None:
    plog = pair[0].logs.get_partition(TP0)
    assert plog is not None
    for offset in range(plog.log_end_offset + 1):  # every offset, also inside batches and at the end
        _same(pair, fetch_frame([(TOPIC, [(0, offset)])], version=version, isolation=isolation), True)
    for limit in (1, 300, 1500, 3000):  # max_bytes cuts (the first batch always comes)
        frame = fetch_frame([(TOPIC, [(0, 0)])], version=version, isolation=isolation, max_bytes=limit)
        _same(pair, frame, True)
        frame = fetch_frame(
            [(TOPIC, [(0, 3)])], version=version, isolation=isolation, partition_max_bytes=limit
        )
        _same(pair, frame, True)
    _same(pair, fetch_frame([(TOPIC, [(1, 2)])], version=version, client_id=None), True)
    _same(pair, fetch_frame([(TOPIC, [(1, 0)])], version=version, client_id="c" * 300, rack="rack-a"), True)
    _same(pair, fetch_frame([("empty", [(0, 0)])], version=version), True)


@pytest.mark.parametrize(
    "frame",
    [
        pytest.param(fetch_frame([(TOPIC, [(0, 999)])]), id="offset-out-of-range"),
        pytest.param(fetch_frame([("missing", [(0, 0)])]), id="unknown-topic"),
        pytest.param(fetch_frame([(TOPIC, [(9, 0)])]), id="unknown-partition"),
        pytest.param(fetch_frame([(TOPIC, [(0, 0), (1, 0)])]), id="two-partitions"),
        pytest.param(fetch_frame([(TOPIC, [(0, 0)]), ("empty", [(0, 0)])]), id="two-topics"),
        pytest.param(fetch_frame([]), id="no-topics"),
        pytest.param(fetch_frame([(TOPIC, [(0, 0)])], session=(5, 3)), id="session-epoch"),
        pytest.param(fetch_frame([(TOPIC, [(0, 0)])], session=(5, -1)), id="session-close"),
        pytest.param(fetch_frame([(TOPIC, [(0, 0)])], forgotten=[("x", [0])]), id="forgotten"),
        pytest.param(fetch_frame([(TOPIC, [(0, 0)])], replica_id=1), id="replica-id"),
        pytest.param(fetch_frame([(TOPIC, [(0, 0)])], isolation=2), id="isolation-2"),
        pytest.param(fetch_frame([(TOPIC, [(0, 0)])], request_tags=b"\x01\x00\x01\x41"), id="cluster-id-tag"),
        pytest.param(fetch_frame([(TOPIC, [(0, 0)])], version=3), id="v3"),
        pytest.param(fetch_frame([(TOPIC, [(0, 0)])], version=13), id="v13"),
        pytest.param(fetch_frame([(TOPIC, [(0, 0)])])[:-3], id="truncated"),
        pytest.param(fetch_frame([(TOPIC, [(0, 0)])]) + b"\x00", id="trailing-byte"),
    ],
)
def test_other_requests_fall_back_to_the_generic_path(pair: tuple[Broker, Broker], frame: bytearray) -> None:
    _same(pair, frame, False)


def test_internal_topics_and_deferless_callers_go_the_generic_way(pair: tuple[Broker, Broker]) -> None:
    fast = pair[0].fast_fetch
    assert fast.answer(fetch_frame([("__consumer_offsets", [(0, 0)])]), False) is None
    result = asyncio.run(dispatch(pair[0], fetch_frame([(TOPIC, [(0, 0)])]), "test"))  # no may_defer
    assert isinstance(result, list)
    assert fast.taken == 0  # type: ignore[attr-defined]


async def _park_both(
    pair: tuple[Broker, Broker], frame: bytearray, appends: list[tuple[int, int]]
) -> tuple[Any, Any]:
    """Both brokers park the fetch; then each append (records, value size) goes to both logs
    with the notify a produce makes, a loop turn apart; returns both answers."""
    tasks = [asyncio.create_task(_ask(b, frame)) for b in pair]
    await asyncio.sleep(0.01)
    assert not any(t.done() for t in tasks)
    for count, size in appends:
        for broker in pair:
            plog = broker.logs.get_partition(TP0)
            assert plog is not None
            append(plog, count, value_size=size)
            broker.waiters.notify(TP0)
        await asyncio.sleep(0.01)
    got, want = await asyncio.gather(*tasks)
    return got, want


@pytest.mark.parametrize("version", [4, 7, 11, 12])
@pytest.mark.parametrize("isolation", [0, 1])
def test_a_parked_fetch_woken_by_an_append_answers_as_the_generic_one(
    pair: tuple[Broker, Broker], version: int, isolation: int
) -> None:
    plog = pair[0].logs.get_partition(TP0)
    assert plog is not None
    # read_committed stops at the open transaction: park at the last stable offset
    at = plog.last_stable_offset if isolation else plog.log_end_offset
    # read_committed cannot move past the open transaction: its fetch runs out its max_wait
    wait = 300 if isolation else 30_000
    frame = fetch_frame([(TOPIC, [(0, at)])], version=version, isolation=isolation, max_wait_ms=wait)
    got, want = asyncio.run(_park_both(pair, frame, [(1, 500)]))
    assert got == want
    assert _counters(pair[0]) == _counters(pair[1])
    assert pair[0].fast_fetch.taken == 1  # type: ignore[attr-defined]


def test_min_bytes_keeps_it_parked_until_enough_bytes_came(pair: tuple[Broker, Broker]) -> None:
    plog = pair[0].logs.get_partition(TP0)
    assert plog is not None
    frame = fetch_frame([(TOPIC, [(0, plog.log_end_offset)])], min_bytes=2500, max_wait_ms=30_000)
    got, want = asyncio.run(_park_both(pair, frame, [(1, 1000), (1, 1000), (1, 1000)]))
    assert got == want
    assert len(got) > 3000  # three batches: the first two did not reach min_bytes
    assert _counters(pair[0]) == _counters(pair[1])


def test_an_empty_answer_after_max_wait(pair: tuple[Broker, Broker]) -> None:
    for isolation in (0, 1):
        plog = pair[0].logs.get_partition(TopicPartition(TOPIC, 1))
        assert plog is not None
        frame = fetch_frame([(TOPIC, [(1, plog.log_end_offset)])], isolation=isolation, max_wait_ms=50)

        async def both(frame: bytearray) -> list[Any]:
            return list(await asyncio.gather(*(_ask(b, frame) for b in pair)))

        got, want = asyncio.run(both(frame))
        assert got == want
    assert _counters(pair[0]) == _counters(pair[1])
    assert pair[0].fast_fetch.taken == 2  # type: ignore[attr-defined]


def test_a_parked_fetch_whose_topic_is_deleted_gets_the_generic_error(pair: tuple[Broker, Broker]) -> None:
    frame = fetch_frame([(TOPIC, [(1, 5)])], max_wait_ms=30_000)

    async def go() -> list[Any]:
        tasks = [asyncio.create_task(_ask(b, frame)) for b in pair]
        await asyncio.sleep(0.01)
        for broker in pair:
            broker.logs.delete_topic(TOPIC)
            broker.waiters.notify(TopicPartition(TOPIC, 1))
        return list(await asyncio.gather(*tasks))

    got, want = asyncio.run(go())
    assert got == want
    assert _counters(pair[0]) == _counters(pair[1])


def test_a_parked_fetch_whose_topic_is_created_again_reads_the_new_log(pair: tuple[Broker, Broker]) -> None:
    """The parked fetch keeps its partition's log: when that log is closed (topic deleted) and
    the topic is created again while it waits, the wake-up finds the new log, parks again on
    an empty read, and answers the first append to it as the generic path does."""
    tp = TopicPartition("empty", 0)
    frame = fetch_frame([("empty", [(0, 0)])], max_wait_ms=30_000)

    async def go() -> list[Any]:
        tasks = [asyncio.create_task(_ask(b, frame)) for b in pair]
        await asyncio.sleep(0.01)
        assert not any(task.done() for task in tasks)  # parked: the log is empty
        for broker in pair:
            broker.logs.delete_topic("empty")
            broker.logs.create_topic("empty", 1, {}, now_ms=NOW)
            broker.waiters.notify(tp)
        await asyncio.sleep(0.01)
        assert not any(task.done() for task in tasks)  # parked again: nothing in the new log
        for broker in pair:
            plog = broker.logs.get_partition(tp)
            assert plog is not None
            append(plog, 2, value_size=40, timestamp=NOW)
            broker.waiters.notify(tp)
        return list(await asyncio.gather(*tasks))

    got, want = asyncio.run(go())
    assert got == want
    assert pair[0].fast_fetch.taken == 1  # type: ignore[attr-defined]
    assert _counters(pair[0]) == _counters(pair[1])


def test_a_cancelled_parked_fetch_leaves_no_waiter(pair: tuple[Broker, Broker]) -> None:
    fast = pair[0]

    async def go() -> None:
        result = await dispatch(
            fast, fetch_frame([(TOPIC, [(1, 5)])], max_wait_ms=30_000), "t", may_defer=True
        )
        assert isinstance(result, Deferred) and isinstance(result.answer, PendingAnswer)
        assert fast.waiters._waiters
        result.answer.cancel()
        assert not fast.waiters._waiters

    asyncio.run(go())


def test_a_parked_fetch_whose_wake_up_read_fails_answers_unknown_server_error(
    pair: tuple[Broker, Broker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read that raises inside the woken fetch (``_Parked.fire``, which holds the read in its
    own ``try``) answers UNKNOWN_SERVER_ERROR and counts it; nothing escapes into the append."""
    from kio.schema.errors import ErrorCode

    from exactly.protocol.fast import encode_fetch_response
    from exactly.server.fetch_fast import frame_answer

    fast = pair[0]
    plog = fast.logs.get_partition(TP0)
    assert plog is not None
    frame = fetch_frame([(TOPIC, [(0, plog.log_end_offset)])], max_wait_ms=30_000, correlation_id=77)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("disk on fire")

    async def go() -> Any:
        task = asyncio.create_task(_ask(fast, frame))
        await asyncio.sleep(0.01)
        assert not task.done()  # parked at the log end
        monkeypatch.setattr(plog, "read", broken)
        append(plog, 1, value_size=40, timestamp=NOW)
        fast.waiters.notify(TP0)
        return await asyncio.wait_for(task, 5)

    got = asyncio.run(go())
    body = encode_fetch_response(12, ErrorCode.unknown_server_error, 0, [])
    want = b"".join(bytes(c) for c in frame_answer(fast, 12, 77, body))
    assert got == want
    assert fast.metrics.errors[(int(ApiKey.FETCH), int(ErrorCode.unknown_server_error))] == 1
