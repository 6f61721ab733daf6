"""The follower's in-place reading of a plain Fetch answer (``follower_response_fast``) against the
generic reader and the generic ``_on_frame`` route: same appends, HW, notifications and next
request, and every unusual answer left to the generic path before anything changed.

The fetcher runs on real partition logs; the replica manager around it is a stand-in holding them,
as in ``test_replica_fetcher_fast.py``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.storage.helpers import make_batch
from tests.support.follower_stubs import Broker, Logs, Manager

from exactly.protocol.fast import FetchPartitionResult, encode_fetch_response
from exactly.protocol.fetch_response import parse_fetch_response
from exactly.replication.truncation import TruncationDecision
from exactly.server import replica_fetcher
from exactly.server.follower_response_fast import read_planned
from exactly.server.replica_fetcher import FETCH_VERSION, LeaderFetcher
from exactly.server.replica_truncation import apply_truncation
from exactly.storage.config import LogConfig
from exactly.storage.partition_log import PartitionLog
from exactly.types import TopicPartition

TPS = (TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("u", 0))
EPOCH = 3


@pytest.fixture(autouse=True)
def _fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Producer state records the append's wall clock: one value for both fetchers."""
    monkeypatch.setattr(replica_fetcher, "now_ms", lambda: 1_800_000_000_000)


def _open(directory: Path, tp: TopicPartition) -> PartitionLog:
    return PartitionLog.open(directory / str(tp), tp, LogConfig(), recovery_point=0, now_ms=0)


def _fetcher(directory: Path, generic: bool) -> LeaderFetcher:
    """A fetcher following TPS from leader 0 at EPOCH, past its truncation; ``generic``: one that
    never reads in place (no plan), the reference."""
    logs = {tp: _open(directory, tp) for tp in TPS}
    fetcher = LeaderFetcher(Manager(Broker(Logs(logs))), leader=0)  # type: ignore[arg-type]
    for tp in TPS:
        fetcher.follow(tp, EPOCH)
        apply_truncation(fetcher.partitions[tp], logs[tp], TruncationDecision(0, True))
    fetcher._build(_active(fetcher))
    if generic:
        fetcher._plan = None  # and again before every answer (``_both``)
    return fetcher


def _active(fetcher: LeaderFetcher) -> list[Any]:
    return [p for p in fetcher.partitions.values() if not p.failed]


def _batch(base_offset: int, count: int, pid: int = 7, seq: int = 0) -> bytes:
    batch = make_batch(count, value_size=100, producer_id=pid, epoch=0, seq=seq)
    batch[0:8] = base_offset.to_bytes(8, "big")
    batch[12:16] = EPOCH.to_bytes(4, "big")  # partition leader epoch (outside the CRC)
    return bytes(batch)


def _part(tp: TopicPartition, records: bytes, hw: int, **kw: Any) -> FetchPartitionResult:
    return FetchPartitionResult(
        tp.partition, kw.get("error", 0), hw, hw, 0, kw.get("aborted"), records, kw.get("diverging")
    )


def _frame(correlation: int, parts: dict[TopicPartition, FetchPartitionResult], **kw: Any) -> bytearray:
    """The leader's answer, as ``encode_fetch_response`` writes it, in the order of ``parts``."""
    topics: dict[str, list[FetchPartitionResult]] = {}
    for tp, part in parts.items():
        topics.setdefault(tp.topic, []).append(part)
    body = encode_fetch_response(FETCH_VERSION, kw.get("error", 0), 0, list(topics.items()))
    return bytearray(struct.pack(">i", correlation) + b"\x00" + b"".join(bytes(c) for c in body))  # type: ignore[arg-type]


def _state(fetcher: LeaderFetcher) -> list[tuple[int, int, bytes, Any]]:
    out = []
    for tp in TPS:
        plog = fetcher.manager.broker.logs.get_partition(tp)
        assert plog is not None
        data = b"".join(p.read_bytes() for p in sorted(plog.directory.glob("*.log")))
        producers = plog.producer_state.active_producers()
        out.append((plog.log_end_offset, plog.high_watermark, data, producers))
    return out


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the generic reader's calls by the fetcher (0: every answer was read in place)."""
    calls: list[int] = []
    real: Callable[..., Any] = parse_fetch_response

    def counted(frame: Any, version: int) -> Any:
        calls.append(1)
        return real(frame, version)

    monkeypatch.setattr(replica_fetcher, "parse_fetch_response", counted)
    return calls


def _both(fast: LeaderFetcher, slow: LeaderFetcher, parts: dict[TopicPartition, FetchPartitionResult]) -> Any:
    """One answer to each (the same bytes, each fetcher's own correlation id): the outcomes, which
    must be equal (a next request is compared byte for byte)."""
    a = fast._on_frame(_frame(fast._correlation, parts))
    slow._plan = None  # ``_build`` makes one with every request: the reference reads generically
    b = slow._on_frame(_frame(slow._correlation, parts))
    assert a == b
    assert _state(fast) == _state(slow)
    assert fast.manager.broker.waiters.notified == slow.manager.broker.waiters.notified
    assert fast._correlation == slow._correlation
    return a


def test_read_planned_finds_what_the_generic_reader_finds(tmp_path: Path) -> None:
    fetcher = _fetcher(tmp_path, generic=False)
    plan = fetcher._plan
    assert plan is not None
    assert [name for name, _ in plan.topics] == [b"t", b"u"]  # the request's grouping
    for records in (
        [_batch(0, 1), b"", _batch(0, 3)],
        [b"", b"", b""],
        [_batch(0, 2) * 1, _batch(0, 1), b""],
    ):
        parts = {tp: _part(tp, r, hw=i + 1) for i, (tp, r) in enumerate(zip(TPS, records, strict=True))}
        frame = _frame(fetcher._correlation, parts)
        planned = read_planned(frame, plan, fetcher._correlation)
        generic = parse_fetch_response(frame, FETCH_VERSION).partitions
        assert planned is not None
        assert [(p.tp, hw, s, e) for p, hw, s, e in planned] == [
            (TopicPartition(g.topic, g.partition), g.high_watermark, g.records_start, g.records_end)
            for g in generic
        ]


def test_plain_answers_read_in_place_match_the_generic_route(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast, slow = _fetcher(tmp_path / "fast", False), _fetcher(tmp_path / "slow", True)
    calls = _counting(monkeypatch)
    builds: list[int] = []
    build = fast._build

    def counted_build(active: list[Any]) -> Any:
        builds.append(1)
        return build(active)

    monkeypatch.setattr(fast, "_build", counted_build)
    offsets = [0, 0, 0]
    generic_calls = 0
    for step in range(8):
        parts = {}
        for i, tp in enumerate(TPS):
            count = (step + i) % 3  # empty answers too
            records = _batch(offsets[i], count, seq=offsets[i]) if count else b""
            offsets[i] += count
            parts[tp] = _part(tp, records, hw=max(offsets[i] - 1, 0))
        outcome = _both(fast, slow, parts)
        generic_calls += 1  # the slow fetcher's
        assert isinstance(outcome, bytearray)  # the next request
    assert len(calls) == generic_calls  # the fast fetcher never used the generic reader
    assert builds == []  # nor ``_build``: each next request was the plan's template refilled
    assert [s[0] for s in _state(fast)] == offsets


_DECLINED = [
    "error",
    "diverging",
    "aborted",
    "missing partition",
    "other order",
    "top-level error",
    "correlation",
    "trailing byte",
]


@pytest.mark.parametrize("case", _DECLINED)
def test_unusual_answers_go_to_the_generic_route(tmp_path: Path, case: str) -> None:
    """Not read in place, and what the fetcher then does is what the generic route does."""
    fast, slow = _fetcher(tmp_path / "fast", False), _fetcher(tmp_path / "slow", True)
    parts = {tp: _part(tp, _batch(0, 1), hw=0) for tp in TPS}
    kw: dict[str, Any] = {}
    if case == "error":
        parts[TPS[1]] = _part(TPS[1], b"", hw=0, error=6)  # NOT_LEADER_OR_FOLLOWER
    elif case == "diverging":
        parts[TPS[1]] = _part(TPS[1], b"", hw=0, diverging=(EPOCH - 1, 0))
    elif case == "aborted":
        parts[TPS[1]] = _part(TPS[1], _batch(0, 1), hw=0, aborted=[(9, 0)])
    elif case == "missing partition":
        del parts[TPS[1]]
    elif case == "other order":
        parts = {tp: parts[tp] for tp in (TPS[1], TPS[0], TPS[2])}
    elif case == "top-level error":
        kw["error"] = 58
    plan = fast._plan
    assert plan is not None
    correlation = fast._correlation + (1 if case == "correlation" else 0)
    frame = _frame(correlation, parts, **kw)
    if case == "trailing byte":
        frame.append(0)
    assert read_planned(frame, plan, fast._correlation) is None
    slow._plan = None
    slow_frame = bytearray(frame)
    slow_frame[0:4] = (slow._correlation + (1 if case == "correlation" else 0)).to_bytes(4, "big")

    def outcome(fetcher: LeaderFetcher, f: bytearray) -> Any:
        try:
            return fetcher._on_frame(f)
        except Exception as exc:  # the generic reader's verdict on a malformed frame
            return type(exc)

    assert outcome(fast, frame) == outcome(slow, slow_frame)
    assert _state(fast) == _state(slow)


@pytest.mark.parametrize("case", ["refollowed", "new epoch", "stopped", "log replaced", "older epoch"])
def test_a_partition_that_moved_on_is_left_to_the_generic_route(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """The answer reads as planned, but a partition is no longer the one asked for: the generic
    route decides (same outcome as a fetcher without a plan), and the next request has a new plan."""
    fast, slow = _fetcher(tmp_path / "fast", False), _fetcher(tmp_path / "slow", True)
    for fetcher in (fast, slow):
        tp = TPS[1]
        if case == "refollowed":  # unfollowed and followed again at the same epoch
            fetcher.unfollow(tp)
            fetcher.follow(tp, EPOCH)
        elif case == "new epoch":
            fetcher.follow(tp, EPOCH + 1)
        elif case == "stopped":
            fetcher.partitions[tp].failed = True
        elif case == "log replaced":  # deleted and created again between request and answer
            logs = fetcher.manager.broker.logs.logs
            directory = logs[tp].directory.parent / "again"
            logs[tp] = _open(directory, tp)
        elif case == "older epoch":
            fetcher.partitions[tp].state.leader_epoch = EPOCH + 1
    parts = {tp: _part(tp, _batch(0, 1), hw=0) for tp in TPS}
    calls = _counting(monkeypatch)
    _both(fast, slow, parts)
    assert len(calls) == 2  # both fetchers used the generic reader
    request = fast._next_step()  # what the task does next: a new plan with the next request
    if isinstance(request, bytearray):
        assert request == slow._next_step()
        assert fast._plan is not None
        planned = [p for _, parts in fast._plan.topics for p in parts]
        assert [p.followed for p in planned] == [fast.partitions[p.tp] for p in planned]
        assert [p.plog for p in planned] == [fast.manager.broker.logs.get_partition(p.tp) for p in planned]
        assert all(p.followed is fast.partitions[p.tp] for p in planned)


def test_a_refused_batch_stops_the_partition_as_the_generic_route_does(tmp_path: Path) -> None:
    fast, slow = _fetcher(tmp_path / "fast", False), _fetcher(tmp_path / "slow", True)
    good = _batch(0, 1)
    bad = bytearray(_batch(0, 1))
    bad[16] = 7  # magic 7: not a batch this log can read
    parts = {
        TPS[0]: _part(TPS[0], good, hw=0),
        TPS[1]: _part(TPS[1], bytes(bad), hw=0),
        TPS[2]: _part(TPS[2], b"", hw=0),
    }

    def outcome(fetcher: LeaderFetcher) -> Any:
        try:
            return fetcher._on_frame(_frame(fetcher._correlation, parts))
        except Exception as exc:
            return type(exc)

    fast_outcome = outcome(fast)
    slow._plan = None
    assert fast_outcome == outcome(slow)
    assert _state(fast) == _state(slow)
    assert [p.failed for p in fast.partitions.values()] == [p.failed for p in slow.partitions.values()]


def test_a_partition_followed_meanwhile_gets_the_generic_next_step(tmp_path: Path) -> None:
    """The answer is read in place (its partitions are still the planned ones), but the next
    request is no longer the plan's: a newly followed partition must be in it (here: truncating
    first, so the task takes over), as the generic route decides."""
    extra = TopicPartition("u", 1)
    fast, slow = _fetcher(tmp_path / "fast", False), _fetcher(tmp_path / "slow", True)
    for fetcher in (fast, slow):
        fetcher.manager.broker.logs.logs[extra] = _open(tmp_path / str(id(fetcher)), extra)
        fetcher.follow(extra, EPOCH)
    parts = {tp: _part(tp, _batch(0, 1), hw=0) for tp in TPS}
    assert _both(fast, slow, parts) is True  # truncation first: the task's turn
    apply_truncation(
        fast.partitions[extra], fast.manager.broker.logs.logs[extra], TruncationDecision(0, True)
    )
    apply_truncation(
        slow.partitions[extra], slow.manager.broker.logs.logs[extra], TruncationDecision(0, True)
    )
    request = fast._next_step()
    assert isinstance(request, bytearray)
    assert request == slow._next_step()
    parts = {tp: _part(tp, _batch(1, 1, seq=1), hw=1) for tp in TPS} | {
        extra: _part(extra, _batch(0, 2), hw=1)
    }
    assert isinstance(_both(fast, slow, parts), bytearray)


@pytest.mark.parametrize("which", ["only batch", "second of two"])
def test_a_corrupt_batch_is_refused_whole_and_fetched_again(tmp_path: Path, which: str) -> None:
    """Kafka's follower checks every replicated batch's CRC before appending any of a partition's
    (``UnifiedLog.analyzeAndValidateRecords`` runs for the REPLICATION origin too) and, on a
    mismatch, logs, backs off and fetches again. Both routes: that partition's log, HW, producer
    state and notifications untouched, not stopped, the others appended; then the good bytes go in."""
    fast, slow = _fetcher(tmp_path / "fast", False), _fetcher(tmp_path / "slow", True)
    corrupt = bytearray(_batch(1, 2, seq=1) if which == "second of two" else _batch(0, 3))
    corrupt[-1] ^= 0xFF  # a record byte: the CRC no longer matches
    first = _batch(0, 1) if which == "second of two" else b""
    parts = {
        TPS[0]: _part(TPS[0], _batch(0, 2), hw=1),
        TPS[1]: _part(TPS[1], first + bytes(corrupt), hw=2),
        TPS[2]: _part(TPS[2], b"", hw=0),
    }
    before = _state(fast)[1]
    assert _both(fast, slow, parts) is True  # the task backs off before the next Fetch
    for fetcher in (fast, slow):
        assert fetcher._backoff_after_frame
        assert _state(fetcher)[1] == before  # not even the good first batch
        assert _state(fetcher)[0][0] == 2
        assert not fetcher.partitions[TPS[1]].failed
        assert TPS[1] not in fetcher.manager.broker.waiters.notified
        fetcher._backoff_after_frame = False
    request = fast._next_step()
    assert isinstance(request, bytearray) and request == slow._next_step()  # the same offset again
    good = first + (_batch(1, 2, seq=1) if which == "second of two" else _batch(0, 3))
    parts = {
        TPS[0]: _part(TPS[0], b"", hw=2),
        TPS[1]: _part(TPS[1], good, hw=2),
        TPS[2]: _part(TPS[2], b"", hw=0),
    }
    assert isinstance(_both(fast, slow, parts), bytearray)
    assert _state(fast)[1][:2] == (3, 2)


def test_the_task_route_refuses_a_corrupt_batch_too(tmp_path: Path) -> None:
    """``_handle_partition`` (the task's loop, after a declined answer) checks the same way."""
    fetcher = _fetcher(tmp_path, generic=True)
    corrupt = bytearray(_batch(0, 2))
    corrupt[70] ^= 0x01
    parts = {TPS[0]: _part(TPS[0], bytes(corrupt), hw=1)}
    frame = _frame(fetcher._correlation, parts)
    before = _state(fetcher)
    (part,) = parse_fetch_response(frame, FETCH_VERSION).partitions
    assert fetcher._handle_partition(frame, part) is False  # a back-off
    assert _state(fetcher) == before
    assert not fetcher.partitions[TPS[0]].failed
