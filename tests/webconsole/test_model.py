"""The console's pure rules: when a transaction counts as hanging, read_committed lag, JSON."""

from __future__ import annotations

from exactly.webconsole import model


def txn(tid: str, pid: int, state: str, partitions: tuple[tuple[str, int], ...]) -> model.Transaction:
    return model.Transaction(tid, pid, 0, state, 60_000, 1, 5, partitions, "")


def test_an_open_transaction_past_its_timeout_or_the_threshold_is_overdue() -> None:
    assert model.overdue_reason("Ongoing", 1000, 1001, 900_000) == "open 1001 ms, past its 1000 ms timeout"
    assert model.overdue_reason("Ongoing", 60_000, 2001, 2000) == "open 2001 ms, longer than 2000 ms"
    assert model.overdue_reason("Ongoing", 60_000, 2000, 2000) == ""
    assert model.overdue_reason("PrepareCommit", 1000, 5000, 900_000) != ""


def test_an_ended_transaction_is_never_overdue() -> None:
    for state in ("Empty", "CompleteCommit", "CompleteAbort", "Dead"):
        assert model.overdue_reason(state, 1000, 10_000, 0) == ""
    assert model.overdue_reason("Ongoing", 1000, -1, 0) == ""


def test_an_open_partition_transaction_no_open_coordinator_transaction_includes_is_untracked() -> None:
    tracked = [txn("a", 7, "Ongoing", (("t", 0),))]
    # producer 7's transaction includes t-0: its coordinator will write the marker
    assert not model.untracked("t", 0, 7, 10, tracked)
    # ... but not t-1, and producer 8 is unknown to every coordinator
    assert model.untracked("t", 1, 7, 10, tracked)
    assert model.untracked("t", 0, 8, 10, tracked)
    # no open transaction on the partition at all
    assert not model.untracked("t", 0, 8, -1, tracked)
    # the id's transaction has ended (its markers are written): anything still open is not its
    assert model.untracked("t", 0, 7, 10, [txn("a", 7, "CompleteCommit", (("t", 0),))])


def test_lag_is_against_the_lso_and_unknown_stays_unknown() -> None:
    assert model.lag(1, 4) == 3
    assert model.lag(5, 4) == 0  # committed past the LSO (read_uncommitted committer): no lag
    assert model.lag(-1, 4) == -1
    assert model.lag(1, -1) == -1


def test_json_carries_the_derived_values() -> None:
    part = model.Partition("t", 0, 0, (0,), (0,), 10, 4, ())
    group = model.Group("g", "Stable", 0, (), (model.GroupOffset("t", 0, 1, 4, 3, ""),))
    overdue = model.Transaction("x", 1, 0, "Ongoing", 1000, 1, 5000, (("t", 0),), "past")
    snap = model.Snapshot("b:1", 1, 900_000, "c", 0, (), (part,), (overdue,), (group,), ())
    out = snap.to_json()
    assert out["partitions"][0]["lso_lag"] == 6
    assert out["transactions"][0]["open"] is True
    assert out["groups"][0]["total_lag"] == 3
    assert out["hanging_count"] == 1
