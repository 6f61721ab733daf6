"""The runner's liveness probe after healing: which history lines count as a writer's progress."""

from __future__ import annotations

from pathlib import Path

from tests.chaos.history import HistoryWriter
from tests.chaos.runner import ChaosConfig, Client


class _NoBroker:
    bootstrap = "127.0.0.1:1"


def _client(tmp_path: Path, role: str, base: str) -> Client:
    return Client(ChaosConfig(seed=1, workdir=tmp_path), _NoBroker(), "t", role, base, [])


def test_a_commit_after_the_mark_is_progress_and_one_before_it_is_not(tmp_path: Path) -> None:
    txn = _client(tmp_path, "txn", "txn0")
    h = HistoryWriter(tmp_path / "hist-txn0-1.jsonl", "txn0")
    h.write("txn_end", txn="txn0#1/0/0", intent="commit", result="ok")
    marks = txn.history_marks()
    assert not txn.progressed_since(marks)
    h.write("txn_end", txn="txn0#1/0/1", intent="abort", result="ok")  # an abort is no progress
    h.write("txn_end", txn="txn0#1/0/2", intent="commit", result="unknown", err="_FENCED")
    assert not txn.progressed_since(marks)
    # a new incarnation's file (created after the mark) counts from its start
    HistoryWriter(tmp_path / "hist-txn0-2.jsonl", "txn0").write(
        "txn_end", txn="txn0#2/1/0", intent="commit", result="ok"
    )
    assert txn.progressed_since(marks)


def test_an_idempotent_writer_progresses_with_an_ack(tmp_path: Path) -> None:
    idem = _client(tmp_path, "idem", "idem0")
    h = HistoryWriter(tmp_path / "hist-idem0-1.jsonl", "idem0")
    marks = idem.history_marks()
    h.write("nack", v="idem0#1/0:0", err="_MSG_TIMED_OUT")
    assert not idem.progressed_since(marks)
    h.write("ack", v="idem0#1/0:1", p=0, o=7)
    assert idem.progressed_since(marks)
    # another writer's history is not this one's
    assert not _client(tmp_path, "idem", "idem1").progressed_since({})
