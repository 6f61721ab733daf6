"""The follower Fetch fast path (exactly.server.follower_fetch_fast) against the generic path.

Two in-process cluster brokers (ZooKeeper never contacted: the metadata and the partition states
are fed to their ReplicaManager as its watches would) lead the same partitions at RF 3 and play
the same script: appends, follower Fetches in the replica fetcher's own bytes
(``ReplicaFetchTemplate``), parked fetches woken by appends, an acks=all produce parked for the
ISR, an ISR expansion, and the unusual requests the fast path must decline (wrong epochs, a
diverging epoch, an offset outside the log, an unknown partition, a non-replica, a consumer).
On one broker the fast path is off. Every answer, the request and byte counters, the HW, each
follower's state, the proposed ISR changes and the produce completions must be identical, and
the fast path must have taken exactly the requests it is meant for.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode
from tests.storage.helpers import append
from tests.support.fast_paths import Counting, Off

from exactly.cluster.zk_base import ObservedState
from exactly.cluster.znodes import LeaderAndIsr, PartitionState, TopicAssignment
from exactly.protocol.apis import ApiKey
from exactly.protocol.fast import FetchPartitionResult, encode_fetch_response
from exactly.protocol.fetch_request import FetchPosition, ReplicaFetchTemplate, encode_replica_fetch
from exactly.replication.fetch_checks import check_diverging_epoch
from exactly.server.broker import Broker, Endpoint
from exactly.server.config import BrokerConfig
from exactly.server.deferred_response import Deferred, PendingAnswer
from exactly.server.dispatch import dispatch
from exactly.server.fetch_fast import frame_answer
from exactly.server.follower_fetch_fast import _frame
from exactly.server.metadata_cache import BrokerEndpoint, CachedTopic
from exactly.server.replica_manager import ReplicaManager
from exactly.storage.leader_epoch import EpochEntry
from exactly.types import TopicPartition

TOPIC = "events"
TP0 = TopicPartition(TOPIC, 0)
TP1 = TopicPartition(TOPIC, 1)
EPOCH = 3


def _open(data_dir: Path, fast: bool, isr: tuple[int, ...]) -> tuple[Broker, list[Any]]:
    conf = {
        "log.dirs": str(data_dir),
        "broker.id": "0",
        "zookeeper.connect": "127.0.0.1:1",  # never connected: the state is fed below
        "auto.create.topics.enable": "false",
    }
    broker = Broker.open(BrokerConfig.load(None, conf), data_dir)
    broker.advertised = Endpoint("127.0.0.1", 9092)
    rm = broker.replicas
    assert isinstance(rm, ReplicaManager)
    proposed: list[Any] = []
    rm.leading._write_isr = lambda tp, leader, update: proposed.append((tp, update.isr))
    rm._set_brokers(
        {b: BrokerEndpoint(b, "127.0.0.1", 9100 + b) for b in (0, 1, 2)},
        {b: 100 + b for b in (0, 1, 2)},  # registered, at these broker epochs
    )
    assignment = TopicAssignment({0: (0, 1, 2), 1: (0, 1, 2)}, topic_id="AAAAAAAAAAAAAAAAAAAAAA")
    rm._set_topic(CachedTopic(TOPIC, assignment, {}))
    for tp in (TP0, TP1):
        rm._on_state(tp, ObservedState(PartitionState(LeaderAndIsr(0, EPOCH, isr, 1), 1), 1))
        assert tp in rm.leaders
    broker.follower_fetch = Counting(broker.follower_fetch) if fast else Off()  # type: ignore[assignment]
    return broker, proposed


def _produce(broker: Broker, tp: TopicPartition, count: int, size: int = 100) -> None:
    """A leader append as the Produce handler makes it (the log, then the leader's bookkeeping)."""
    plog = broker.logs.get_partition(tp)
    assert plog is not None
    append(plog, count, value_size=size, leader_epoch=EPOCH, advance_hw=False)
    assert broker.replicas is not None
    broker.replicas.after_leader_append(plog)


def _fetch(
    replica: int,
    positions: list[tuple[int, int, int]],  # (partition, fetch offset, current epoch)
    *,
    version: int = 12,
    max_wait_ms: int = 500,
    last_epoch: int = EPOCH,
    correlation_id: int = 7,
    topic: str = TOPIC,
) -> bytearray:
    """The replica fetcher's request bytes (without the size prefix)."""
    parts = [
        FetchPosition(p, epoch, offset, 0, 1024 * 1024, last_fetched_epoch=last_epoch)
        for p, offset, epoch in positions
    ]
    template = ReplicaFetchTemplate.build(
        version, f"replica-{replica}", replica_id=replica, max_wait_ms=max_wait_ms, min_bytes=1,
        max_bytes=10 * 1024 * 1024, topics=[(topic, parts)],
    )  # fmt: skip
    frame = template.fill(correlation_id, [(p.fetch_offset, last_epoch, 0) for p in parts])
    assert bytes(frame) == encode_replica_fetch(
        version, correlation_id, f"replica-{replica}", replica_id=replica, max_wait_ms=max_wait_ms,
        min_bytes=1, max_bytes=10 * 1024 * 1024, topics=[(topic, parts)],
    )  # fmt: skip
    return frame[4:]


async def _send(broker: Broker, frame: bytearray) -> Any:
    """What a connection would get: bytes now, or an answer still pending."""
    result = await dispatch(broker, bytearray(frame), "test", may_defer=True)
    if isinstance(result, Deferred):
        return result.answer
    return b"".join(bytes(c) for c in result)


async def _done(answer: Any) -> bytes:
    if isinstance(answer, PendingAnswer):
        assert answer.done(), "a parked fetch was not answered"
        answer = answer.result()
    if isinstance(answer, list):
        return b"".join(bytes(c) for c in answer)
    assert isinstance(answer, bytes)
    return answer


def _state(broker: Broker) -> Any:
    rm = broker.replicas
    assert rm is not None
    out = []
    for tp in (TP0, TP1):
        leader = rm.leaders[tp]
        plog = broker.logs.get_partition(tp)
        assert plog is not None
        followers = {b: (f.log_end_offset, f.log_start_offset) for b, f in leader.followers.items()}
        out.append((leader.high_watermark, plog.high_watermark, leader.isr, followers))
    return out, broker.metrics.requests[int(ApiKey.FETCH)], broker.metrics.bytes_out


Script = Callable[[Broker, list[Any]], Coroutine[Any, Any, None]]


def _compare(script: Script, isr: tuple[int, ...] = (0, 1, 2)) -> int:
    """Run ``script`` on a fast and a generic broker; the transcripts must match. Returns how
    many requests the fast path took."""
    transcripts = []
    brokers = []
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        for data_dir, fast in ((a, True), (b, False)):
            broker, proposed = _open(Path(data_dir), fast, isr)
            brokers.append(broker)
            out: list[Any] = []
            asyncio.run(script(broker, out))
            out.append(("isr proposals", proposed))
            out.append(("state", _state(broker)))
            transcripts.append(out)
            broker.logs.close()
    assert transcripts[0] == transcripts[1]
    assert brokers[1].follower_fetch.taken == 0  # type: ignore[attr-defined]
    return int(brokers[0].follower_fetch.taken)  # type: ignore[attr-defined]


def test_steady_state_follower_fetches_take_the_fast_path_with_the_generic_bytes_and_state() -> None:
    async def script(broker: Broker, out: list[Any]) -> None:
        _produce(broker, TP0, 3)
        _produce(broker, TP1, 2, size=3000)
        for version in (11, 12):
            # catching up: records at once (several partitions), then parked at the log end
            for replica in (1, 2):
                answer = await _send(broker, _fetch(replica, [(0, 0, EPOCH), (1, 0, EPOCH)], version=version))
                out.append(await _done(answer))
                out.append(_state(broker))
            parked = []
            for replica in (1, 2):
                frame = _fetch(
                    replica,
                    [(0, 3 + 2 * (version - 11), EPOCH), (1, 2 + 2 * (version - 11), EPOCH)],
                    version=version,
                )
                answer = await _send(broker, frame)
                out.append(isinstance(answer, PendingAnswer) and not answer.done())
                parked.append(answer)
            out.append(_state(broker))
            _produce(broker, TP0, 2)  # the append answers both parked fetches from inside it
            for answer in parked:
                out.append(await _done(answer))
            out.append(_state(broker))
            _produce(broker, TP1, 2)
            # the followers come back at their new log ends: the HW follows, and they park again
            for replica in (1, 2):
                answer = await _send(
                    broker,
                    _fetch(
                        replica,
                        [(0, 5 + 2 * (version - 11), EPOCH), (1, 4 + 2 * (version - 11), EPOCH)],
                        version=version,
                    ),
                )
                out.append(isinstance(answer, PendingAnswer) and not answer.done())
                if isinstance(answer, PendingAnswer):
                    answer.cancel()  # the connection went away: unparked
                out.append(_state(broker))

    assert _compare(script) == 12


def test_a_follower_fetch_completes_the_acks_all_produce_and_expands_the_isr() -> None:
    async def script(broker: Broker, out: list[Any]) -> None:
        rm = broker.replicas
        assert rm is not None
        _produce(broker, TP0, 4)
        leader = rm.leaders[TP0]
        done: list[Any] = []
        parked = rm.park_for_acks(TP0, leader, 4, 1, 5.0, lambda code: done.append(int(code)))
        out.append(isinstance(parked, ErrorCode))
        for replica, offset in ((1, 0), (1, 4), (2, 0), (2, 4)):
            answer = await _send(broker, _fetch(replica, [(0, offset, EPOCH)], max_wait_ms=0))
            out.append(await _done(answer))
            out.append((list(done), _state(broker)))

    # ISR (0, 1): follower 1 reaching the log end completes the produce, follower 2 joins
    assert _compare(script, isr=(0, 1)) == 4


def test_unusual_follower_fetches_are_declined_before_any_change() -> None:
    async def script(broker: Broker, out: list[Any]) -> None:
        _produce(broker, TP0, 3)
        _produce(broker, TP1, 1)
        frames = [
            _fetch(1, [(0, 0, EPOCH + 1)]),  # UNKNOWN_LEADER_EPOCH
            _fetch(1, [(0, 0, EPOCH - 1)]),  # FENCED_LEADER_EPOCH
            _fetch(1, [(0, 0, EPOCH), (1, 0, EPOCH + 1)]),  # one bad partition of two
            _fetch(1, [(0, 2, EPOCH)], last_epoch=EPOCH + 5),  # a diverging epoch
            _fetch(1, [(0, 9, EPOCH)]),  # beyond the log end: OFFSET_OUT_OF_RANGE
            _fetch(1, [(5, 0, EPOCH)]),  # unknown partition
            _fetch(1, [(0, 0, EPOCH)], topic="nope"),  # unknown topic
            _fetch(7, [(0, 0, EPOCH)]),  # not a replica of the partition
            _fetch(-1, [(0, 0, EPOCH)]),  # a consumer
        ]
        for frame in frames:
            answer = await _send(broker, frame)
            out.append(await _done(answer))
            out.append(_state(broker))

    assert _compare(script) == 0


def test_a_parked_fetch_woken_by_a_role_change_gets_the_generic_answer() -> None:
    async def script(broker: Broker, out: list[Any]) -> None:
        rm = broker.replicas
        assert rm is not None
        _produce(broker, TP0, 2)
        answer = await _send(broker, _fetch(1, [(0, 2, EPOCH)]))
        out.append(isinstance(answer, PendingAnswer) and not answer.done())
        # a new leader epoch with this broker still leading: the parked fetch is woken
        rm._on_state(TP0, ObservedState(PartitionState(LeaderAndIsr(0, EPOCH + 1, (0, 1, 2), 1), 2), 2))
        await asyncio.sleep(0)  # ``notify`` fires it on the next loop turn
        await asyncio.sleep(0)
        out.append(await _done(answer))
        out.append(_state(broker))

    assert _compare(script) == 1


def test_the_answer_written_in_place_is_the_generic_encoders_bytes() -> None:
    """``_frame`` against ``frame_answer(encode_fetch_response(...))``: both versions, one and
    several topics and partitions, empty records, sizes whose varint takes 1-3 bytes, long and
    non-ASCII topic names; same bytes and same ``bytes_out``."""
    shapes: list[list[tuple[str, list[tuple[int, int, int, int, bytes]]]]] = [
        [(TOPIC, [(0, 5, 5, 0, b"")])],
        [(TOPIC, [(0, 7, 7, 2, b"x" * 61)])],
        [(TOPIC, [(3, 9, 8, 1, b"y" * 200), (1, 4, 4, 0, b""), (0, 2**40, 2**40, 2**39, b"z" * 20_000)])],
        [
            ("a" * 126, [(0, 1, 1, 0, b"r" * 127)]),
            ("évènements", [(2, 0, 0, 0, b"")]),
            ("t", [(1, 3, 3, 3, b"q")]),
        ],
        [(f"topic-{i}", [(p, p * 10, p * 10, p, b"b" * p) for p in range(i + 1)]) for i in range(5)],
    ]
    with tempfile.TemporaryDirectory() as d:
        broker, _ = _open(Path(d), True, (0, 1, 2))
        try:
            for version in (11, 12):
                for shape in shapes:
                    generic = [
                        (
                            name,
                            [
                                FetchPartitionResult(i, 0, hw, lso, start, None, rec)
                                for i, hw, lso, start, rec in parts
                            ],
                        )
                        for name, parts in shape
                    ]
                    before = broker.metrics.bytes_out
                    expected = b"".join(
                        bytes(c)
                        for c in frame_answer(
                            broker, version, 4242, encode_fetch_response(version, 0, 0, generic)
                        )
                    )
                    generic_out = broker.metrics.bytes_out - before
                    before = broker.metrics.bytes_out
                    written = _frame(broker, version, 4242, shape)  # type: ignore[arg-type]
                    assert b"".join(bytes(c) for c in written) == expected, (version, shape)
                    assert broker.metrics.bytes_out - before == generic_out == len(expected)
                    # the records go out as their own chunks (a FileSlice is sent with sendfile)
                    assert [
                        c for c in written if c is not None and any(c is p[4] for _n, ps in shape for p in ps)
                    ] == [p[4] for _n, ps in shape for p in ps if p[4]]
        finally:
            broker.logs.close()


def test_a_fetch_in_the_leaders_latest_epoch_never_diverges() -> None:
    """What ``_checked`` skips ``check_diverging_epoch`` on: last fetched epoch = the leader's
    latest, offset inside the log. Every such case there answers no error and no divergence."""
    histories = [
        (EpochEntry(0, 0),),
        (EpochEntry(0, 0), EpochEntry(3, 10)),
        (EpochEntry(1, 5), EpochEntry(2, 7), EpochEntry(7, 7), EpochEntry(9, 40)),
    ]
    for entries in histories:
        for log_start in (0, 5, 20):
            for log_end in (log_start, 40, 41, 100):
                if log_end < log_start:
                    continue
                for offset in range(log_start, log_end + 1):
                    check = check_diverging_epoch(
                        entries,
                        last_fetched_epoch=entries[-1].epoch,
                        fetch_offset=offset,
                        log_start_offset=log_start,
                        log_end_offset=log_end,
                    )
                    assert check.error == ErrorCode.none and check.diverging is None


def test_a_follower_behind_in_an_older_epoch_is_checked_for_divergence() -> None:
    """The leader's log holds epochs EPOCH - 1 (offsets 0-1) and EPOCH (2-4). A follower whose last
    fetched epoch is the older one is checked in full: asking beyond that epoch's end (offset 4)
    diverges and goes to the generic path (DivergingEpoch); asking at its end (offset 2) does not and
    is taken. Only the fetch in the leader's latest epoch skips the check (``_checked``)."""

    async def script(broker: Broker, out: list[Any]) -> None:
        plog = broker.logs.get_partition(TP0)
        assert plog is not None and broker.replicas is not None
        append(plog, 2, value_size=100, leader_epoch=EPOCH - 1, advance_hw=False)
        broker.replicas.after_leader_append(plog)
        _produce(broker, TP0, 3)
        for offset in (4, 2):
            answer = await _send(broker, _fetch(1, [(0, offset, EPOCH)], last_epoch=EPOCH - 1))
            out.append(await _done(answer))
            out.append(_state(broker))

    assert _compare(script) == 1


# ---- the wake-up re-check (ReplicaManager.role_changes) ---------------------------------------


def test_an_append_wake_up_repeats_only_the_log_checks() -> None:
    """A parked follower Fetch woken by an append with no role change in between is not put
    through ``check_follower_read`` again (its answer is the generic one: the steady-state test
    above compares them)."""

    async def run(data_dir: Path) -> None:
        broker, _ = _open(data_dir, True, (0, 1, 2))
        rm = broker.replicas
        assert isinstance(rm, ReplicaManager)
        checks: list[TopicPartition] = []
        check = rm.check_follower_read

        def counted(tp: TopicPartition, replica_id: int, epoch: int) -> ErrorCode:
            checks.append(tp)
            return check(tp, replica_id, epoch)

        rm.check_follower_read = counted  # type: ignore[method-assign]
        _produce(broker, TP0, 2)
        answer = await _send(broker, _fetch(1, [(0, 2, EPOCH), (1, 0, EPOCH)]))
        assert isinstance(answer, PendingAnswer) and not answer.done()
        assert checks == [TP0, TP1]  # on arrival
        _produce(broker, TP0, 1)
        assert answer.done()
        assert checks == [TP0, TP1]  # not again at the wake-up
        broker.logs.close()

    with tempfile.TemporaryDirectory() as d:
        asyncio.run(run(Path(d)))


def _parked_then(change: Callable[[ReplicaManager], None], wake: bool) -> Script:
    """A fetch parked at the log end, ``change`` applied, then (``wake``) an append."""

    async def script(broker: Broker, out: list[Any]) -> None:
        rm = broker.replicas
        assert isinstance(rm, ReplicaManager)
        _produce(broker, TP0, 2)
        answer = await _send(broker, _fetch(1, [(0, 2, EPOCH)]))
        out.append(isinstance(answer, PendingAnswer) and not answer.done())
        before = rm.role_changes
        change(rm)
        out.append(rm.role_changes > before)
        if wake:
            plog = broker.logs.get_partition(TP0)
            assert plog is not None
            append(plog, 1, leader_epoch=EPOCH, advance_hw=False)
            rm.after_leader_append(plog)  # as the produce path would, whatever the role now
        for _ in range(3):
            await asyncio.sleep(0)  # ``notify`` fires on a later loop turn
        out.append(await _done(answer))

    return script


def _reassigned(rm: ReplicaManager) -> None:
    """Replica 1 moved out of partition 0's assignment: no wake-up by itself."""
    assignment = TopicAssignment({0: (0, 2, 3), 1: (0, 1, 2)}, topic_id="AAAAAAAAAAAAAAAAAAAAAA")
    rm._set_topic(CachedTopic(TOPIC, assignment, {}))


def test_a_change_between_park_and_wake_up_is_checked_again() -> None:
    """Every way a follower read's replica checks can change counts in ``role_changes`` first,
    so the woken fetch gets the generic path's answer (an error), never records it would refuse:
    an assignment that no longer holds the fetcher (then an append wakes it), this broker turned
    follower, leaderships resigned at shutdown."""
    follower = ObservedState(PartitionState(LeaderAndIsr(1, EPOCH + 1, (1, 2), 1), 2), 2)
    changes: list[tuple[Callable[[ReplicaManager], None], bool]] = [
        (_reassigned, True),
        (lambda rm: rm._on_state(TP0, follower), False),
        (lambda rm: rm.resign_leaderships(), False),
    ]
    for change, wake in changes:
        transcripts = []
        for fast in (True, False):
            with tempfile.TemporaryDirectory() as d:
                broker, _ = _open(Path(d), fast, (0, 1, 2))
                out: list[Any] = []
                asyncio.run(_parked_then(change, wake)(broker, out))
                transcripts.append(
                    (out, broker.metrics.requests[int(ApiKey.FETCH)], broker.metrics.bytes_out)
                )
                assert broker.follower_fetch.taken == (1 if fast else 0)  # type: ignore[attr-defined]
                broker.logs.close()
        assert transcripts[0] == transcripts[1]
        assert transcripts[0][0][-1] != transcripts[0][0][0]  # answered


def test_a_repeated_arrival_skips_only_the_replica_checks_it_passed() -> None:
    """A replica's Fetch of the same partitions in the same epochs as its last one that passed
    ``check_follower_read``, with no role change in between, is not checked again on arrival;
    another replica, another partition list or another epoch is (the answers are the generic
    ones: the steady-state test compares them)."""

    async def run(data_dir: Path) -> None:
        broker, _ = _open(data_dir, True, (0, 1, 2))
        rm = broker.replicas
        assert isinstance(rm, ReplicaManager)
        checks: list[tuple[TopicPartition, int]] = []
        check = rm.check_follower_read

        def counted(tp: TopicPartition, replica_id: int, epoch: int) -> ErrorCode:
            checks.append((tp, replica_id))
            return check(tp, replica_id, epoch)

        rm.check_follower_read = counted  # type: ignore[method-assign]
        _produce(broker, TP0, 3)
        _produce(broker, TP1, 3)
        steps: list[tuple[int, list[tuple[int, int, int]], list[tuple[TopicPartition, int]]]] = [
            (1, [(0, 0, EPOCH), (1, 0, EPOCH)], [(TP0, 1), (TP1, 1)]),  # first: checked
            (1, [(0, 1, EPOCH), (1, 2, EPOCH)], []),  # same list, other offsets: skipped
            (2, [(0, 0, EPOCH), (1, 0, EPOCH)], [(TP0, 2), (TP1, 2)]),  # another replica
            (1, [(0, 2, EPOCH), (1, 2, EPOCH)], []),  # replica 1's entry is still there
            (1, [(0, 2, EPOCH)], [(TP0, 1)]),  # fewer partitions: checked
            (1, [(0, 2, EPOCH), (1, 2, EPOCH)], [(TP0, 1), (TP1, 1)]),  # the list changed back
        ]
        for replica, positions, expected in steps:
            checks.clear()
            answer = await _send(broker, _fetch(replica, positions))
            assert isinstance(answer, bytes | list), answer  # answered at once: records there
            assert checks == expected, (replica, positions)
        broker.logs.close()

    with tempfile.TemporaryDirectory() as d:
        asyncio.run(run(Path(d)))


def test_a_change_between_two_fetches_is_checked_on_arrival() -> None:
    """The second of two identical Fetches from one replica, with a change of what the replica
    checks read in between, gets the generic path's answer (an error): an assignment without
    the fetcher, this broker turned follower, leaderships resigned, a new leader epoch here
    (the follower still asking in the old one)."""
    follower = ObservedState(PartitionState(LeaderAndIsr(1, EPOCH + 1, (1, 2), 1), 2), 2)
    bumped = ObservedState(PartitionState(LeaderAndIsr(0, EPOCH + 1, (0, 1, 2), 1), 2), 2)
    changes: list[Callable[[ReplicaManager], None]] = [
        _reassigned,
        lambda rm: rm._on_state(TP0, follower),
        lambda rm: rm.resign_leaderships(),
        lambda rm: rm._on_state(TP0, bumped),
    ]
    for change in changes:

        async def script(broker: Broker, out: list[Any], change: Any = change) -> None:
            rm = broker.replicas
            assert isinstance(rm, ReplicaManager)
            _produce(broker, TP0, 3)
            out.append(await _done(await _send(broker, _fetch(1, [(0, 0, EPOCH)]))))
            change(rm)
            out.append(await _done(await _send(broker, _fetch(1, [(0, 1, EPOCH)], max_wait_ms=0))))

        transcripts = []
        for fast in (True, False):
            with tempfile.TemporaryDirectory() as d:
                broker, _ = _open(Path(d), fast, (0, 1, 2))
                out: list[Any] = []
                asyncio.run(script(broker, out))
                transcripts.append(
                    (out, broker.metrics.requests[int(ApiKey.FETCH)], broker.metrics.bytes_out)
                )
                assert broker.follower_fetch.taken == (1 if fast else 0)  # type: ignore[attr-defined]
                broker.logs.close()
        assert transcripts[0] == transcripts[1]
