"""The chaos checker on hand-made histories: a clean one passes, each planted anomaly is caught
(and only that kind is reported)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.checker import KINDS, check
from tests.chaos.history import HistoryWriter, load_history

pytestmark = pytest.mark.timeout(30)


def clean_history() -> list[dict[str, Any]]:
    """Two partitions. idem writer a/0 sends 3 values; txn writer t/0 commits one txn and aborts one;
    a txn of unknown outcome that never became visible; an rc and an ru reader plus final reads."""
    ev: list[dict[str, Any]] = []
    for n, (p, o) in enumerate([(0, 0), (0, 1), (1, 0)]):
        ev.append({"t": "send", "proc": "a", "v": f"a/0:{n}", "p": p})
        ev.append({"t": "ack", "proc": "a", "v": f"a/0:{n}", "p": p, "o": o})
    # committed txn T1: t/0:0 @ (0,2), t/0:1 @ (1,1); marker at (0,3), (1,2)
    ev.append({"t": "txn_begin", "proc": "t", "txn": "T1"})
    for n, (p, o) in enumerate([(0, 2), (1, 1)]):
        ev.append({"t": "txn_send", "proc": "t", "txn": "T1", "v": f"t/0:{n}", "p": p})
        ev.append({"t": "ack", "proc": "t", "v": f"t/0:{n}", "p": p, "o": o})
    ev.append({"t": "txn_end", "proc": "t", "txn": "T1", "intent": "commit", "result": "ok"})
    # aborted txn T2: t/0:2 @ (0,4); abort marker (0,5)
    ev.append({"t": "txn_begin", "proc": "t", "txn": "T2"})
    ev.append({"t": "txn_send", "proc": "t", "txn": "T2", "v": "t/0:2", "p": 0})
    ev.append({"t": "ack", "proc": "t", "v": "t/0:2", "p": 0, "o": 4})
    ev.append({"t": "txn_end", "proc": "t", "txn": "T2", "intent": "abort", "result": "ok"})
    # unknown txn T3 (process killed before commit): never read under rc
    ev.append({"t": "txn_begin", "proc": "t", "txn": "T3"})
    ev.append({"t": "txn_send", "proc": "t", "txn": "T3", "v": "t/0:3", "p": 1})
    ev.append({"t": "ack", "proc": "t", "v": "t/0:3", "p": 1, "o": 3})
    # an idempotent send that failed: indeterminate, not required
    ev.append({"t": "send", "proc": "a", "v": "a/0:3", "p": 1})
    ev.append({"t": "nack", "proc": "a", "v": "a/0:3", "err": "timed out"})
    # concurrent readers
    ev.append(
        {"t": "read", "proc": "rc", "iso": "rc", "session": 1, "recs": [[0, 0, "a/0:0"], [0, 1, "a/0:1"]]}
    )
    ev.append(
        {"t": "read", "proc": "rc", "iso": "rc", "session": 1, "recs": [[0, 2, "t/0:0"], [1, 0, "a/0:2"]]}
    )
    ev.append(
        {
            "t": "read",
            "proc": "ru",
            "iso": "ru",
            "session": 1,
            "recs": [[0, 0, "a/0:0"], [0, 1, "a/0:1"], [0, 2, "t/0:0"], [0, 4, "t/0:2"]],
        }
    )
    # final reads reach the ends: p0 -> 6, p1 -> 5 (unknown txn aborted by timeout at (1,4))
    ev.append(
        {
            "t": "read",
            "proc": "final",
            "iso": "rc",
            "session": "final",
            "final": True,
            "recs": [[0, 0, "a/0:0"], [0, 1, "a/0:1"], [0, 2, "t/0:0"], [1, 0, "a/0:2"], [1, 1, "t/0:1"]],
            "upto": {"0": 6, "1": 5},
        }
    )
    ev.append(
        {
            "t": "read",
            "proc": "final",
            "iso": "ru",
            "session": "final-ru",
            "final": True,
            "recs": [
                [0, 0, "a/0:0"],
                [0, 1, "a/0:1"],
                [0, 2, "t/0:0"],
                [0, 4, "t/0:2"],
                [1, 0, "a/0:2"],
                [1, 1, "t/0:1"],
                [1, 3, "t/0:3"],
            ],
            "upto": {"0": 6, "1": 5},
        }
    )
    ev.append({"t": "fault", "proc": "runner", "what": "kill9"})
    return ev


def only(report: Any, kind: str) -> None:
    assert report.counts[kind] >= 1, f"{kind} not caught:\n{report.summary()}"
    others = {k: n for k, n in report.counts.items() if k != kind and n}
    assert not others, f"planted {kind} but also got {others}:\n{report.summary()}"


def test_clean_history_has_no_anomalies() -> None:
    report = check(clean_history())
    assert report.ok, report.summary()
    assert (
        report.stats["committed"] == 1 and report.stats["aborted"] == 1 and report.stats["txn_unknown"] == 1
    )
    assert report.stats["faults"] == 1


def reads(ev: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in ev if e["t"] == "read"]


def test_lost_acked_idempotent_write() -> None:
    ev = clean_history()
    for e in reads(ev):
        e["recs"] = [r for r in e["recs"] if r[2] != "a/0:1"]
    only(check(ev), "lost")


def test_ack_without_offset_still_must_be_read() -> None:
    # librdkafka acks a timed-out request without an offset once a later sequence is acked
    ev = clean_history()
    for e in ev:
        if e["t"] == "ack" and e["v"] == "a/0:1":
            e["o"] = None
    assert check(ev).ok
    for e in reads(ev):
        e["recs"] = [r for r in e["recs"] if r[2] != "a/0:1"]
    only(check(ev), "unseen")


def test_lost_committed_txn_value() -> None:
    ev = clean_history()
    for e in reads(ev):
        e["recs"] = [r for r in e["recs"] if r[2] != "t/0:1"]
    report = check(ev)
    only(report, "lost")
    assert report.anomalies["lost"][0]["txn"] == "T1"


def test_partial_transaction_of_unknown_outcome_is_lost() -> None:
    ev = clean_history()
    # T4 (outcome unknown) has two values; rc readers saw one, and read past the other
    ev += [
        {"t": "txn_begin", "proc": "t", "txn": "T4"},
        {"t": "txn_send", "proc": "t", "txn": "T4", "v": "t/0:4", "p": 0},
        {"t": "ack", "proc": "t", "v": "t/0:4", "p": 0, "o": 6},
        {"t": "txn_send", "proc": "t", "txn": "T4", "v": "t/0:5", "p": 0},
        {"t": "ack", "proc": "t", "v": "t/0:5", "p": 0, "o": 7},
        {"t": "read", "proc": "rc", "iso": "rc", "session": 2, "recs": [[0, 7, "t/0:5"]], "upto": {"0": 9}},
    ]
    only(check(ev), "lost")


def test_unseen_when_nobody_read_that_far() -> None:
    ev = clean_history()
    ev += [
        {"t": "send", "proc": "a", "v": "a/0:9", "p": 1},
        {"t": "ack", "proc": "a", "v": "a/0:9", "p": 1, "o": 50},
    ]
    only(check(ev), "unseen")


def test_duplicate_value() -> None:
    ev = clean_history()
    reads(ev)[-1]["recs"].append([1, 4, "a/0:2"])  # a/0:2 again at (1,4)
    only(check(ev), "duplicate")


def test_duplicate_between_ack_and_read() -> None:
    ev = clean_history()
    ev.append(
        {"t": "read", "proc": "ru", "iso": "ru", "session": 1, "recs": [[1, 7, "a/0:3"], [1, 8, "a/0:3"]]}
    )
    only(check(ev), "duplicate")


def test_aborted_read_of_aborted_txn() -> None:
    ev = clean_history()
    ev.append({"t": "read", "proc": "rc", "iso": "rc", "session": 3, "recs": [[0, 4, "t/0:2"]]})
    report = check(ev)
    only(report, "aborted_read")
    assert report.anomalies["aborted_read"][0]["txn"] == "T2"


def test_aborted_read_of_txn_whose_commit_failed_and_was_aborted() -> None:
    ev = clean_history()
    ev += [
        {"t": "txn_begin", "proc": "t", "txn": "T5"},
        {"t": "txn_send", "proc": "t", "txn": "T5", "v": "t/0:6", "p": 1},
        {"t": "ack", "proc": "t", "v": "t/0:6", "p": 1, "o": 5},
        {"t": "txn_end", "proc": "t", "txn": "T5", "intent": "commit", "result": "aborted", "err": "x"},
        {"t": "read", "proc": "rc", "iso": "rc", "session": 4, "recs": [[1, 5, "t/0:6"]]},
    ]
    only(check(ev), "aborted_read")


def test_read_of_a_value_nobody_wrote() -> None:
    ev = clean_history()
    ev.append({"t": "read", "proc": "rc", "iso": "rc", "session": 5, "recs": [[1, 9, "garbage"]]})
    only(check(ev), "aborted_read")


def test_inconsistent_offset_between_readers() -> None:
    ev = clean_history()
    ev.append({"t": "read", "proc": "ru", "iso": "ru", "session": 6, "recs": [[0, 1, "t/0:3"]]})
    report = check(ev)
    assert report.counts["inconsistent_offset"] == 1
    # t/0:3 now also sits at two offsets: a duplicate as well, and nothing else
    assert {k for k, n in report.counts.items() if n} == {"inconsistent_offset", "duplicate"}


def test_inconsistent_offset_between_ack_and_read() -> None:
    ev = clean_history()
    for e in ev:
        if e["t"] == "ack" and e["v"] == "a/0:2":
            e["o"] = 1  # acked at (1,1), where everybody read t/0:1
    for e in reads(ev):
        e["recs"] = [r for r in e["recs"] if r[2] != "a/0:2"]
    report = check(ev)
    assert report.counts["inconsistent_offset"] == 1
    # the acked value was never read where it was acked: lost as well, and nothing else
    assert {k for k, n in report.counts.items() if n} == {"inconsistent_offset", "lost"}


def test_producer_order_violation() -> None:
    ev = clean_history()
    ev = copy.deepcopy(ev)
    for e in ev:  # swap where a/0:0 and a/0:1 landed
        if e.get("v") == "a/0:0" and e["t"] == "ack":
            e["o"] = 1
        elif e.get("v") == "a/0:1" and e["t"] == "ack":
            e["o"] = 0
    for e in reads(ev):
        e["recs"] = [[p, o, {"a/0:0": "a/0:1", "a/0:1": "a/0:0"}.get(v, v)] for p, o, v in e["recs"]]
    report = check(ev)
    only(report, "order")
    assert report.anomalies["order"][0]["why"] == "producer order"


def test_consumer_going_backwards_is_an_order_violation() -> None:
    ev = clean_history()
    ev.append({"t": "read", "proc": "rc", "iso": "rc", "session": 1, "recs": [[0, 1, "a/0:1"]]})
    report = check(ev)
    only(report, "order")
    assert report.anomalies["order"][0]["why"] == "consumer went backwards"


def test_hung_transactions() -> None:
    ev = clean_history()
    ev.append({"t": "hung", "proc": "runner", "hw": {"0": 6}, "lso": {"0": 4}})
    only(check(ev), "hung")


def test_replica_divergence_from_the_cluster_verification() -> None:
    ev = clean_history()
    ev.append({"t": "replicas", "proc": "runner", "identical": True, "partitions": 5, "verdicts": None})
    assert check(ev).ok
    ev.append(
        {"t": "replicas", "proc": "runner", "identical": False, "partitions": 5, "verdicts": "t-0: ..."}
    )
    only(check(ev), "replica_divergence")


def test_every_kind_has_a_planted_test() -> None:
    names = {n for n in globals() if n.startswith("test_")}
    for kind in KINDS:
        assert any(kind.split("_")[0] in n for n in names), kind


def test_history_files_round_trip_and_survive_a_torn_line(tmp_path: Path) -> None:
    w = HistoryWriter(tmp_path / "hist-p1.jsonl", "p1")
    w.write("send", v="p1/0:0", p=0)
    w.write("ack", v="p1/0:0", p=0, o=0)
    w.close()
    with (tmp_path / "hist-p1.jsonl").open("ab") as f:
        f.write(b'{"t":"send","v":"p1/0:1"')  # killed mid-line
    (tmp_path / "hist-p2.jsonl").write_text('{"t":"read","iso":"rc","session":1,"recs":[[0,0,"p1/0:0"]]}\n')
    events = load_history(tmp_path)
    assert [e["t"] for e in events] == ["send", "ack", "read"]
    assert events[2]["proc"] == "p2"
    assert check(events).ok


def test_a_writer_stalled_after_healing() -> None:
    ev = clean_history()
    ev.append({"t": "stalled", "proc": "runner", "writers": ["txn0"], "seconds": 30.0})
    report = check(ev)
    only(report, "stalled")
    assert report.anomalies["stalled"][0]["writers"] == ["txn0"]
