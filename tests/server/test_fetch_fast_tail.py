"""A parked fast-path Fetch woken by a fast Produce answers from the batch that Produce wrote
(``fetch_fast._Parked.fire`` with ``ParkedFetch.tail``): the same bytes as the generic path.

Two in-process brokers hold the same logs and get the same frames through ``dispatch`` as a
connection passes them: on one both fast paths are on (the Produce hands its batch to the waiters,
the woken Fetch may answer from it), on the other both are off (the Produce goes the generic way,
the Fetch awaits the generic wait and reads the log). Every answer and the counters must be
identical. The fast broker's log reads are counted: a wake-up that answers from the batch reads
nothing, every case the batch cannot answer (two appends before the wake-up, min_bytes above the
batch, an open transaction holding the LSO back, a batch the generic read would send as a file
slice, the log start moved past the offset, the topic deleted) reads the log as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from tests.server.test_fetch_fast import fetch_frame
from tests.server.test_produce_fast import batch, produce_frame
from tests.storage.helpers import append, append_marker
from tests.support.fast_paths import MakePair, fetch_pair_fixture  # noqa: F401  (fixture: fetch_pair)

from exactly.protocol.apis import ApiKey
from exactly.server.broker import Broker
from exactly.server.deferred_response import Deferred, PendingAnswer
from exactly.server.dispatch import dispatch
from exactly.server.handlers.fetch import SLICE_FROM
from exactly.storage.file_slice import FileSlice
from exactly.storage.partition_log import PartitionLog
from exactly.types import TopicPartition

NOW = 1_700_000_000_000
TOPIC = "tail"
# partition 0: plain records, a committed and an aborted transaction (entries in the transaction
# index), nothing open; partition 1: the same and then a transaction left open (its LSO stays)
P0, P1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)


def _fill_partition(plog: PartitionLog, open_txn: bool) -> None:
    append(plog, 3, value_size=200, timestamp=NOW)
    append(plog, 2, value_size=300, producer_id=7, epoch=0, seq=0, transactional=True)
    append(plog, 1, value_size=100, producer_id=8, epoch=0, seq=0, transactional=True)
    append_marker(plog, 7, 0, abort=False)
    append(plog, 2, value_size=50)
    append_marker(plog, 8, 0, abort=True)
    if open_txn:
        append(plog, 1, value_size=70, producer_id=9, epoch=0, seq=0, transactional=True)


def _fill(broker: Broker) -> None:
    broker.logs.create_topic(TOPIC, 2, {}, now_ms=NOW)
    for tp, open_txn in ((P0, False), (P1, True)):
        plog = broker.logs.get_partition(tp)
        assert plog is not None
        _fill_partition(plog, open_txn)


@pytest.fixture
def pair(fetch_pair: MakePair) -> tuple[Broker, Broker]:
    """The fast broker's fast Fetch counted, the generic one's fast Fetch and Produce off."""
    return fetch_pair(_fill, generic_produce_off=True)


def _count_reads(broker: Broker, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count ``PartitionLog.read`` on every partition of ``broker`` (one counter for all)."""
    reads = [0]
    for tp in (P0, P1):
        plog = broker.logs.get_partition(tp)
        assert plog is not None
        real = plog.read

        def counted(*args: Any, _real: Callable[..., Any] = real, **kwargs: Any) -> Any:
            reads[0] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(plog, "read", counted)
    return reads


async def _answer(broker: Broker, frame: bytearray, file_slices: bool = False) -> Any:
    """The bytes a connection would write (``file_slices``: a plaintext one's, which sends
    large records as a slice of the segment file)."""
    result = await dispatch(broker, bytearray(frame), "test", may_defer=True, file_slices=file_slices)
    if isinstance(result, Deferred):
        answer = result.answer
        result = await answer.wait() if isinstance(answer, PendingAnswer) else await answer
    if result is None:
        return None
    return b"".join(c.read() if isinstance(c, FileSlice) else bytes(c) for c in result)


async def _park_then_produce(
    broker: Broker,
    fetch: bytearray,
    produces: list[bytearray],
    meanwhile: Callable[[Broker], None] | None = None,
    file_slices: bool = False,
) -> Any:
    """Park the fetch, then send the produces back to back (one loop turn: each appends and
    notifies before the woken fetch runs), then ``meanwhile``; the fetch's answer."""
    task = asyncio.create_task(_answer(broker, fetch, file_slices))
    await asyncio.sleep(0.01)
    assert not task.done()  # parked
    for produce in produces:
        acked = await dispatch(broker, bytearray(produce), "test", may_defer=True)
        assert isinstance(acked, list)  # answered within the call (acks=all on a single broker)
    if meanwhile is not None:
        meanwhile(broker)
    return await asyncio.wait_for(task, 10)


def _same(
    pair: tuple[Broker, Broker],
    fetch: bytearray,
    produces: list[bytearray],
    meanwhile: Callable[[Broker], None] | None = None,
    file_slices: bool = False,
) -> Any:
    fast, generic = pair
    got = asyncio.run(_park_then_produce(fast, fetch, produces, meanwhile, file_slices))
    want = asyncio.run(_park_then_produce(generic, fetch, produces, meanwhile, file_slices))
    assert got == want
    for key in (int(ApiKey.FETCH), int(ApiKey.PRODUCE)):
        assert fast.metrics.requests[key] == generic.metrics.requests[key]
    assert fast.metrics.bytes_out == generic.metrics.bytes_out
    assert fast.fast_fetch.taken == 1  # type: ignore[attr-defined]
    return got


def _end(broker: Broker, tp: TopicPartition) -> int:
    plog = broker.logs.get_partition(tp)
    assert plog is not None
    return plog.log_end_offset


@pytest.mark.parametrize("version", [4, 5, 7, 11, 12])
@pytest.mark.parametrize("isolation", [0, 1])
def test_the_woken_fetch_answers_from_the_produced_batch_with_the_generic_bytes(
    pair: tuple[Broker, Broker], version: int, isolation: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the log end of a partition with aborted transactions behind it (read_committed's
    answer then carries an empty aborted list, as the generic read's search finds none)."""
    reads = _count_reads(pair[0], monkeypatch)
    fetch = fetch_frame(
        [(TOPIC, [(0, _end(pair[0], P0))])], version=version, isolation=isolation, max_wait_ms=30_000
    )
    got = _same(pair, fetch, [produce_frame([(TOPIC, [(0, batch(3, size=120))])])])
    assert reads[0] == 0  # from the batch: no log read
    assert len(got) > 3 * 120


def test_a_max_bytes_below_the_batch_still_gets_the_whole_batch(
    pair: tuple[Broker, Broker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read returns at least one whole batch, whatever max_bytes says (the fast path's
    reads are min_one_batch), so the batch answers a fetch whose max_bytes it exceeds too."""
    reads = _count_reads(pair[0], monkeypatch)
    fetch = fetch_frame(
        [(TOPIC, [(0, _end(pair[0], P0))])], max_wait_ms=30_000, max_bytes=10, partition_max_bytes=10
    )
    _same(pair, fetch, [produce_frame([(TOPIC, [(0, batch(2, size=300))])])])
    assert reads[0] == 0


def test_two_appends_before_the_wake_up_read_the_log(
    pair: tuple[Broker, Broker], monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = _count_reads(pair[0], monkeypatch)
    fetch = fetch_frame([(TOPIC, [(0, _end(pair[0], P0))])], isolation=1, max_wait_ms=30_000)
    produce = produce_frame([(TOPIC, [(0, batch(1, size=80))])])
    got = _same(pair, fetch, [produce, produce])
    assert reads[0] == 1  # both batches, from the log
    assert got.count(bytes([0]) * 80) == 2


def test_min_bytes_above_the_batch_keeps_it_parked_and_reads_the_log(
    pair: tuple[Broker, Broker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """min_bytes above the batch: the wake-up reads (and parks again), as the generic path
    does; the next wake-up brings enough."""
    fast, generic = pair
    reads = _count_reads(fast, monkeypatch)
    fetch = fetch_frame([(TOPIC, [(0, _end(fast, P0))])], min_bytes=500, max_wait_ms=30_000)
    small = produce_frame([(TOPIC, [(0, batch(1, size=100))])])

    async def go(broker: Broker) -> Any:
        task = asyncio.create_task(_answer(broker, fetch))
        for _ in range(2):
            await asyncio.sleep(0.01)
            assert not task.done()
            await dispatch(broker, bytearray(small), "test", may_defer=True)
            await asyncio.sleep(0.01)
        assert not task.done()  # two batches of ~170 bytes: below 500
        await dispatch(
            broker, bytearray(produce_frame([(TOPIC, [(0, batch(3, size=200))])])), "test", may_defer=True
        )
        return await asyncio.wait_for(task, 10)

    assert asyncio.run(go(fast)) == asyncio.run(go(generic))
    assert fast.metrics.bytes_out == generic.metrics.bytes_out
    assert reads[0] == 3  # every wake-up read the log


@pytest.mark.parametrize("isolation", [0, 1])
def test_an_open_transaction_before_the_batch(
    pair: tuple[Broker, Broker], isolation: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Partition 1 holds an open transaction: read_uncommitted at the log end answers from the
    batch; read_committed at the log end is past the LSO (the batch is not below its bound),
    reads, finds nothing and answers empty at its max_wait, as the generic path."""
    reads = _count_reads(pair[0], monkeypatch)
    fetch = fetch_frame([(TOPIC, [(1, _end(pair[0], P1))])], isolation=isolation, max_wait_ms=200)
    got = _same(pair, fetch, [produce_frame([(TOPIC, [(1, batch(2, size=90))])])])
    if isolation:
        assert reads[0] >= 1 and bytes([0]) * 90 not in got
    else:
        assert reads[0] == 0 and bytes([0]) * 90 in got


@pytest.mark.parametrize("size", [SLICE_FROM - 200, SLICE_FROM])
def test_a_batch_the_generic_read_sends_as_a_file_slice_is_read(
    pair: tuple[Broker, Broker], size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a plaintext connection records of SLICE_FROM bytes or more go as a file slice: such a
    batch is read (a slice of the file), a batch just below it answers from the batch."""
    reads = _count_reads(pair[0], monkeypatch)
    fetch = fetch_frame([(TOPIC, [(0, _end(pair[0], P0))])], max_wait_ms=30_000)
    got = _same(pair, fetch, [produce_frame([(TOPIC, [(0, batch(1, size=size))])])], file_slices=True)
    assert reads[0] == (1 if size >= SLICE_FROM else 0)
    assert len(got) > size


def test_the_log_start_moved_past_the_offset_answers_the_generic_error(
    pair: tuple[Broker, Broker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """DeleteRecords up to the log end between the append and the wake-up: OFFSET_OUT_OF_RANGE
    from the generic read, not the batch."""

    def delete(broker: Broker) -> None:
        done = broker.logs.delete_records({P0: _end(broker, P0)})
        assert done[P0] == _end(broker, P0)

    fetch = fetch_frame([(TOPIC, [(0, _end(pair[0], P0))])], max_wait_ms=30_000)
    got = _same(pair, fetch, [produce_frame([(TOPIC, [(0, batch(1, size=60))])])], delete)
    assert bytes([0]) * 60 not in got


def test_a_topic_deleted_before_the_wake_up_answers_the_generic_error(pair: tuple[Broker, Broker]) -> None:
    fetch = fetch_frame([(TOPIC, [(0, _end(pair[0], P0))])], max_wait_ms=30_000)
    got = _same(
        pair,
        fetch,
        [produce_frame([(TOPIC, [(0, batch(1, size=60))])])],
        lambda broker: broker.logs.delete_topic(TOPIC),
    )
    assert bytes([0]) * 60 not in got


@pytest.mark.parametrize("isolation", [0, 1])
def test_an_append_after_the_batch_without_a_notify_is_read(
    pair: tuple[Broker, Broker], isolation: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch appended after the fast Produce's (here straight to the log, no notify, so the
    woken fetch still holds the first batch) moves the high watermark past it: the read."""
    reads = _count_reads(pair[0], monkeypatch)

    def more(broker: Broker) -> None:
        plog = broker.logs.get_partition(P0)
        assert plog is not None
        append(plog, 1, value_size=33, timestamp=NOW)

    fetch = fetch_frame([(TOPIC, [(0, _end(pair[0], P0))])], isolation=isolation, max_wait_ms=30_000)
    got = _same(pair, fetch, [produce_frame([(TOPIC, [(0, batch(1, size=60))])])], more)
    assert reads[0] == 1
    assert len(got) > 60 + 33  # both batches
