"""The cluster leader's Produce fast path (exactly.server.produce_fast_cluster) against the generic path.

Two in-process cluster brokers (ZooKeeper never contacted: the metadata and partition states are
fed to their ReplicaManager as its watches would, as in test_follower_fetch_fast) lead the same
partitions at RF 3 and get the same Produce frames through ``dispatch``; on one the fast path is
off. acks=1 and acks=-1 produces, idempotent and not, completed by the followers' Fetches, by a
role change, or at once with an ISR of one; and the requests the fast path must decline
(NOT_ENOUGH_REPLICAS, NOT_LEADER_OR_FOLLOWER, an unknown partition, a duplicate, a sequence
error, a transactional id, acks=-1 for a caller that cannot take a deferred answer). Every
answer and its completion, the counters, the logs' bytes, LEO/HW, the leader epoch cache, each
follower's state and producer state must be identical, and the fast path must have taken exactly
the requests of its shape.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from tests.server.test_follower_fetch_fast import EPOCH, TOPIC, TP0, TP1, _fetch
from tests.server.test_follower_fetch_fast import _open as _open_cluster
from tests.server.test_produce_fast import NOW, batch, produce_frame
from tests.support.fast_paths import Counting, Off

import exactly.server.dispatch as dispatch_module
import exactly.server.handlers.produce as produce_module
from exactly.cluster.zk_base import ObservedState
from exactly.cluster.znodes import LeaderAndIsr, PartitionState
from exactly.protocol.apis import ApiKey
from exactly.server.broker import Broker
from exactly.server.deferred_response import Deferred, PendingAnswer
from exactly.server.dispatch import dispatch

PID = 4000


def _open(data_dir: Path, fast: bool, isr: tuple[int, ...]) -> Broker:
    broker, _proposed = _open_cluster(data_dir, True, isr)
    broker.cluster_produce = Counting(broker.cluster_produce) if fast else Off()  # type: ignore[assignment]
    return broker


async def _send(broker: Broker, frame: bytearray, may_defer: bool = True) -> Any:
    """What a connection would get: bytes now, or an answer still pending."""
    result = await dispatch(broker, bytearray(frame), "test", may_defer=may_defer)
    if isinstance(result, Deferred):
        assert isinstance(result.answer, PendingAnswer)
        return result.answer
    return b"".join(bytes(c) for c in result)


def _answer(answer: Any) -> Any:
    if isinstance(answer, PendingAnswer):
        if not answer.done():
            return "pending"
        return b"".join(bytes(c) for c in answer.result())
    return answer


def _state(broker: Broker) -> Any:
    rm = broker.replicas
    assert rm is not None
    out: list[Any] = []
    for tp in (TP0, TP1):
        plog = broker.logs.get_partition(tp)
        assert plog is not None
        leader = rm.leaders.get(tp)
        followers = None
        if leader is not None:
            followers = (
                leader.high_watermark,
                leader.isr,
                {b: (f.log_end_offset, f.log_start_offset) for b, f in leader.followers.items()},
            )
        segments = [(p.name, p.read_bytes()) for p in sorted(plog.directory.glob("*.log"))]
        producers = {pid: repr(e) for pid, e in plog.producer_state.active_producers().items()}
        out.append(
            (
                plog.log_end_offset,
                plog.high_watermark,
                list(plog.leader_epochs.entries),
                followers,
                segments,
                producers,
            )
        )
    m = broker.metrics
    counters = (
        m.requests[int(ApiKey.PRODUCE)],
        m.requests[int(ApiKey.FETCH)],
        m.messages_in,
        m.bytes_out,
        m.duplicate_batches,
        sorted(m.errors.items()),
    )
    return out, counters, len(rm.delayed_produces._waiters.get(TP0, ()))


Script = Callable[[Broker, list[Any]], Coroutine[Any, Any, None]]


def _compare(script: Script, isr: tuple[int, ...] = (0, 1, 2)) -> int:
    """Run ``script`` on a fast and a generic broker; the transcripts must match. Returns how
    many requests the fast path took."""
    transcripts = []
    brokers = []
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        for data_dir, fast in ((a, True), (b, False)):
            broker = _open(Path(data_dir), fast, isr)
            brokers.append(broker)
            out: list[Any] = []
            asyncio.run(script(broker, out))
            out.append(("state", _state(broker)))
            transcripts.append(out)
            broker.logs.close()
    for step, (fast, generic) in enumerate(zip(transcripts[0], transcripts[1], strict=True)):
        assert fast == generic, f"step {step}"
    assert brokers[1].cluster_produce.taken == 0  # type: ignore[attr-defined]
    return int(brokers[0].cluster_produce.taken)  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def _fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatch_module, "now_ms", lambda: NOW)
    monkeypatch.setattr(produce_module, "now_ms", lambda: NOW)


def _frame(partition: int, records: bytes, acks: int = -1, correlation_id: int = 7, **kw: Any) -> bytearray:
    return produce_frame([(TOPIC, [(partition, records)])], acks=acks, correlation_id=correlation_id, **kw)


def test_acks_1_and_acks_all_produces_completed_by_the_followers_take_the_fast_path() -> None:
    async def script(broker: Broker, out: list[Any]) -> None:
        # acks=1: answered at once, the followers' parked Fetches woken by the append
        parked = [await _send(broker, _fetch(r, [(0, 0, EPOCH)])) for r in (1, 2)]
        out.append([_answer(p) for p in parked])
        out.append(_answer(await _send(broker, _frame(0, batch(3, pid=PID, epoch=0, seq=0), acks=1))))
        out.append([_answer(p) for p in parked])
        out.append(_state(broker))
        # acks=-1, idempotent, on both partitions and versions: waits for both followers
        for version, (partition, seq) in zip((9, 10, 11), ((0, 3), (1, 0), (0, 5)), strict=True):
            frame = produce_frame(
                [(TOPIC, [(partition, batch(2, pid=PID + partition, epoch=0, seq=seq))])],
                version=version,
                correlation_id=20 + version,
            )
            answer = await _send(broker, frame)
            out.append(_answer(answer))
            out.append(_state(broker))
            plog = broker.logs.get_partition(TP0 if partition == 0 else TP1)
            assert plog is not None
            end = plog.log_end_offset
            for replica in (1, 2):
                fetched = await _send(broker, _fetch(replica, [(partition, end, EPOCH)], max_wait_ms=0))
                out.append(_answer(fetched))
                out.append(_answer(answer))
                out.append(_state(broker))
            assert isinstance(_answer(answer), bytes)  # completed by the second follower
        # a plain (non-idempotent) acks=-1 batch
        answer = await _send(broker, _frame(1, batch(1), correlation_id=40))
        out.append(_answer(answer))
        for replica in (1, 2):
            out.append(_answer(await _send(broker, _fetch(replica, [(1, 3, EPOCH)], max_wait_ms=0))))
        out.append(_answer(answer))

    assert _compare(script) == 5


def test_an_isr_of_one_answers_acks_all_at_once() -> None:
    async def script(broker: Broker, out: list[Any]) -> None:
        for seq in (0, 2):
            out.append(_answer(await _send(broker, _frame(0, batch(2, pid=PID, epoch=0, seq=seq)))))
            out.append(_state(broker))

    assert _compare(script, isr=(0,)) == 2


def test_a_parked_acks_all_produce_completed_by_a_role_change_gets_the_generic_answer() -> None:
    async def script(broker: Broker, out: list[Any]) -> None:
        rm = broker.replicas
        assert rm is not None
        answer = await _send(broker, _frame(0, batch(2, pid=PID, epoch=0, seq=0)))
        out.append(_answer(answer))
        # another broker leads now: the parked produce is answered NOT_LEADER_OR_FOLLOWER
        rm._on_state(TP0, ObservedState(PartitionState(LeaderAndIsr(1, EPOCH + 1, (1, 2), 1), 2), 2))
        for _ in range(3):
            await asyncio.sleep(0)
        out.append(_answer(answer))
        assert isinstance(_answer(answer), bytes)
        out.append(_state(broker))
        # and a produce to it now is declined: the generic path answers NOT_LEADER_OR_FOLLOWER
        out.append(_answer(await _send(broker, _frame(0, batch(2, pid=PID, epoch=0, seq=2)))))
        out.append(_state(broker))

    assert _compare(script) == 1


def test_a_cancelled_acks_all_produce_is_discarded() -> None:
    async def script(broker: Broker, out: list[Any]) -> None:
        answer = await _send(broker, _frame(0, batch(2, pid=PID, epoch=0, seq=0)))
        out.append(_state(broker))
        answer.cancel()  # the connection went away
        out.append(_state(broker))

    assert _compare(script) == 1


def test_unusual_produces_are_declined_before_any_change() -> None:
    async def script(broker: Broker, out: list[Any]) -> None:
        out.append(_answer(await _send(broker, _frame(0, batch(2, pid=PID, epoch=0, seq=0), acks=1))))
        frames = [
            _frame(0, batch(2, pid=PID, epoch=0, seq=0), acks=1),  # a duplicate
            _frame(0, batch(2, pid=PID, epoch=0, seq=9), acks=1),  # OUT_OF_ORDER_SEQUENCE_NUMBER
            _frame(5, batch(2), acks=1),  # an unknown partition
            produce_frame([("nope", [(0, batch(2))])], acks=1),  # an unknown topic
            _frame(0, batch(2), acks=0),  # acks=0
            _frame(0, batch(2), acks=2),  # INVALID_REQUIRED_ACKS
            _frame(0, batch(2), acks=1, txn_id="t"),  # a transactional id
            produce_frame([(TOPIC, [(0, batch(1)), (1, batch(1))])], acks=1),  # two partitions
        ]
        for frame in frames:
            result = await dispatch(broker, bytearray(frame), "test", may_defer=True)
            out.append(None if result is None else _answer(b"".join(bytes(c) for c in result)))
            out.append(_state(broker))
        # acks=-1 for a caller that cannot take a deferred answer: the generic path awaits it
        task = asyncio.create_task(_send(broker, _frame(1, batch(1)), may_defer=False))
        await asyncio.sleep(0)
        for replica in (1, 2):
            out.append(_answer(await _send(broker, _fetch(replica, [(1, 2, EPOCH)], max_wait_ms=0))))
        out.append(await task)
        out.append(_state(broker))

    assert _compare(script) == 1


def test_not_enough_replicas_is_the_generic_answer() -> None:
    async def script(broker: Broker, out: list[Any]) -> None:
        for tp in (TP0, TP1):
            plog = broker.logs.get_partition(tp)
            assert plog is not None
            plog.config = plog.config.with_overrides({"min.insync.replicas": "2"})
        out.append(_answer(await _send(broker, _frame(0, batch(2, pid=PID, epoch=0, seq=0)))))
        out.append(_answer(await _send(broker, _frame(0, batch(2, pid=PID, epoch=0, seq=0), acks=1))))
        out.append(_state(broker))

    assert _compare(script, isr=(0,)) == 1
