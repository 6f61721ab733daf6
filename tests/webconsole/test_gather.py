"""The console's snapshot and abort calls against a real broker (a subprocess) holding an open,
a committed and an overdue transaction and a consumer group (see conftest.py)."""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest

from exactly.client.wire import WireError
from exactly.testing.wait import wait_until
from exactly.webconsole import model
from exactly.webconsole.gather import Gatherer
from tests.webconsole.conftest import HANGING_TIMEOUT_MS, Scenario

pytestmark = pytest.mark.timeout(120)


def by_id(snap: model.Snapshot) -> dict[str, model.Transaction]:
    return {t.transactional_id: t for t in snap.transactions}


def partitions(snap: model.Snapshot, topic: str) -> dict[int, model.Partition]:
    return {p.partition: p for p in snap.partitions if p.topic == topic}


def snapshot_when(g: Gatherer, cond: Callable[[model.Snapshot], bool], what: str) -> model.Snapshot:
    """The first snapshot for which ``cond`` holds."""

    def attempt() -> model.Snapshot | None:
        snap = g.snapshot()
        return snap if cond(snap) else None

    return wait_until(attempt, 30, what)


def overdue_snapshot(g: Gatherer, s: Scenario) -> model.Snapshot:
    """A snapshot taken once the hanging transaction is past its timeout."""
    return snapshot_when(g, lambda snap: bool(by_id(snap)[s.hanging_id].hanging_reason), "flagged as hanging")


def test_snapshot_shows_offsets_producers_transactions_and_read_committed_lag(scenario: Scenario) -> None:
    s = scenario
    with_gatherer = Gatherer(s.bootstrap, timeout_s=10, hanging_after_ms=model.DEFAULT_HANGING_AFTER_MS)
    try:
        snap = overdue_snapshot(with_gatherer, s)
    finally:
        with_gatherer.close()
    assert snap.errors == ()
    assert [(b.broker_id, b.is_controller) for b in snap.brokers] == [(snap.controller_id, True)]

    p = partitions(snap, s.topic)
    # partition 0: committed records 0-2, marker 3, the open transaction's record at 4
    assert (p[0].high_watermark, p[0].lso, p[0].lso_lag) == (5, 4, 1)
    # partition 1: the hanging transaction's record at 0 holds the LSO at 0
    assert (p[1].high_watermark, p[1].lso, p[1].lso_lag) == (1, 0, 1)

    txns = by_id(snap)
    committed, open_, hanging = txns[s.committed_id], txns[s.open_id], txns[s.hanging_id]
    assert committed.state == "CompleteCommit" and not committed.is_open and committed.hanging_reason == ""
    assert open_.state == "Ongoing" and open_.partitions == ((s.topic, 0),) and open_.hanging_reason == ""
    assert hanging.state == "Ongoing" and hanging.partitions == ((s.topic, 1),)
    assert hanging.timeout_ms == HANGING_TIMEOUT_MS and hanging.age_ms > HANGING_TIMEOUT_MS
    assert "past its 1000 ms timeout" in hanging.hanging_reason
    late = txns[s.late_id]  # its coordinator is done with it: the late write is not its concern
    assert late.state == "CompleteCommit" and late.partitions == () and late.hanging_reason == ""
    assert snap.hanging_count == 2  # the overdue transaction and the orphan

    producers = {(tp, q.producer_id): q for tp, part in p.items() for q in part.producers}
    pc = producers[(0, committed.producer_id)]
    assert (pc.last_sequence, pc.txn_start_offset) == (2, -1)
    assert producers[(0, open_.producer_id)].txn_start_offset == 4
    assert producers[(1, hanging.producer_id)].txn_start_offset == 0
    assert not any(q.orphan for q in producers.values())  # every open one is tracked by its coordinator

    (stuck,) = partitions(snap, s.stuck_topic).values()
    assert (stuck.high_watermark, stuck.lso) == (3, 2)  # held at the late write
    (orphan,) = stuck.producers
    assert (orphan.producer_id, orphan.txn_start_offset, orphan.orphan) == (s.late_pid, 2, True)

    (group,) = [g for g in snap.groups if g.group_id == s.group]
    assert group.state == "Stable" and len(group.members) == 1
    assert sorted(group.members[0].partitions) == [(s.topic, 0), (s.topic, 1)]
    (offset,) = group.offsets
    assert (offset.partition, offset.committed, offset.lso, offset.lag) == (0, 1, 4, 3)
    assert offset.member == group.members[0].member_id


def test_abort_by_transactional_id_ends_the_hanging_transaction(scenario: Scenario) -> None:
    s = scenario
    g = Gatherer(s.bootstrap, timeout_s=10, hanging_after_ms=model.DEFAULT_HANGING_AFTER_MS)
    try:
        overdue_snapshot(g, s)
        message = g.abort_transactional_id(s.hanging_id)
        assert message.startswith(f"Aborted the Ongoing transaction of '{s.hanging_id}' ({s.topic}-1)")
        snap = snapshot_when(g, lambda snap: not by_id(snap)[s.hanging_id].is_open, "the abort completed")
        aborted = by_id(snap)[s.hanging_id]
        # InitProducerId aborted it and bumped the epoch (the producer is fenced): Empty, or
        # CompleteAbort if the snapshot came between the markers and the epoch bump
        assert aborted.state in ("Empty", "CompleteAbort") and aborted.hanging_reason == ""
        assert aborted.producer_epoch >= 1
        p1 = partitions(snap, s.topic)[1]
        assert p1.lso == p1.high_watermark == 2  # the record and the ABORT marker; nothing holds it
        assert by_id(snap)[s.open_id].state == "Ongoing"  # the others are untouched
    finally:
        g.close()


def test_abort_on_a_partition_ends_the_orphan(scenario: Scenario) -> None:
    s = scenario
    g = Gatherer(s.bootstrap, timeout_s=10, hanging_after_ms=model.DEFAULT_HANGING_AFTER_MS)
    try:
        message = g.abort_partition(s.stuck_topic, 0, s.late_pid)
        assert message == (
            f"Wrote an ABORT marker for producer {s.late_pid} on {s.stuck_topic}-0 "
            "(its transaction started at offset 2)."
        )
        (stuck,) = partitions(g.snapshot(), s.stuck_topic).values()
        assert stuck.lso == stuck.high_watermark == 4  # + the marker; nothing holds the LSO
        assert [q.txn_start_offset for q in stuck.producers] == [-1]
        with pytest.raises(WireError, match="no open transaction"):
            g.abort_partition(s.stuck_topic, 0, s.late_pid)
    finally:
        g.close()


def test_an_unreachable_cluster_is_an_error_in_the_snapshot_not_an_exception() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        g = Gatherer(f"127.0.0.1:{port}", timeout_s=2, hanging_after_ms=1000)
        snap = g.snapshot()
        g.close()
    assert snap.errors and snap.errors[0].startswith("Metadata: ")
    assert (snap.brokers, snap.partitions, snap.transactions, snap.groups) == ((), (), (), ())
