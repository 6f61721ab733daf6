"""The zombie scenario with real processes (tests/support/txn_copier.py).

A consume-transform-produce copier reads a batch, writes its copies inside a transaction and
freezes (SIGSTOP) before committing. Its session expires, the group rebalances to a replacement that
copies everything from the committed offsets and commits. The frozen one is resumed (SIGCONT): its
commit must fail, and the output must hold each input record exactly once under read_committed.

Two designs of transactional.id:
* ``partition`` - one id per input partition: the replacement's InitProducerId bumps the epoch,
  aborts the zombie's open transaction at once and fences the zombie's producer (PRODUCER_FENCED).
* ``process`` - one id per process (KIP-447): nothing fences the zombie's producer, so its open
  transaction holds the output's LSO back while it is frozen; on resume its TxnOffsetCommit carries
  a generation/member the group no longer has, the broker refuses it, and the zombie aborts.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BrokerFactory
from tests.support.broker import child_env
from tests.support.clients import create_topic, produce_values
from tests.support.txn_helpers import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    end_offsets,
    fresh_config,
    log_entries,
    read_to_end,
    wait_until,
    wire_offset_fetch,
)
from tests.support.wire import WireClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

REPO = Path(__file__).resolve().parents[2]
PER_PARTITION = 30
PARTITIONS = (0, 1)


class CopierProcess:
    """A txn_copier subprocess and the JSON events it prints."""

    def __init__(self, name: str, args: list[str]) -> None:
        env = child_env(paths=[REPO])
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.txn_copier", "--name", name, *args],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.events: list[dict[str, Any]] = []
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._pump_err, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self._queue.put(json.loads(line))
            except ValueError:
                self._queue.put({"event": "noise", "line": line.decode(errors="replace")})
        self._queue.put(None)

    def _pump_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line.decode(errors="replace"))

    def wait_event(self, name: str, timeout: float) -> dict[str, Any]:
        """The next event called ``name`` (earlier events are kept in ``events``)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{self.name}: no '{name}' event within {timeout}s; {self.describe()}")
            try:
                ev = self._queue.get(timeout=left)
            except queue.Empty:
                continue
            if ev is None:
                self._queue.put(None)
                raise AssertionError(f"{self.name} exited before '{name}'; {self.describe()}")
            self.events.append(ev)
            if ev["event"] == name:
                return ev

    def drain(self, timeout: float) -> int:
        """Wait for exit, collecting the remaining events; -> exit code."""
        rc = self.proc.wait(timeout)
        while True:
            try:
                ev = self._queue.get(timeout=2)
            except queue.Empty:
                break
            if ev is None:
                break
            self.events.append(ev)
        return rc

    def of(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == name]

    def stopped(self) -> bool:
        try:
            stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        except FileNotFoundError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] == "T"

    def describe(self) -> str:
        return f"events={[e['event'] for e in self.events]} rc={self.proc.poll()} stderr={''.join(self.stderr)[-2000:]}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGCONT)
                self.proc.kill()
                self.proc.wait(10)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize("tid_mode", ["partition", "process"])
def test_frozen_copier_is_fenced_and_output_is_exactly_once(
    fresh_broker: BrokerFactory, unique_name: Callable[[str], str], tid_mode: str
) -> None:
    b = fresh_broker(**fresh_config())
    src, dst, group = unique_name("zin"), unique_name("zout"), unique_name("zgroup")
    create_topic(b.bootstrap, src, partitions=len(PARTITIONS))
    create_topic(b.bootstrap, dst, partitions=len(PARTITIONS))
    for part in PARTITIONS:
        produce_values(
            b.bootstrap, src, [f"rec-{part}-{i}".encode() for i in range(PER_PARTITION)], partition=part
        )
    common = [
        "--bootstrap", b.bootstrap, "--input", src, "--output", dst, "--group", group,
        "--tid-prefix", unique_name("ztx"), "--tid-mode", tid_mode, "--batch", "10",
    ]  # fmt: skip

    procs: list[CopierProcess] = []
    try:
        zombie = CopierProcess("zombie", [*common, "--freeze-on-batch", "2"])
        procs.append(zombie)
        zombie.wait_event("committed", 30)  # batch 1 goes through normally
        frozen = zombie.wait_event("freezing", 15)  # batch 2 is written, not committed
        wait_until(zombie.stopped, 5, "zombie stopped (SIGSTOP)")
        zombie_keys = frozen_keys = zombie.of("batch")[-1]["keys"]
        committed_by_zombie = [k for e in zombie.of("committed") for k in e["keys"]]
        assert frozen and len(frozen_keys) == 10

        frozen_at = time.monotonic()
        replacement = CopierProcess("replacement", common)
        procs.append(replacement)
        assert replacement.drain(60) == 0, replacement.describe()
        print(
            f"[{tid_mode}] replacement finished {time.monotonic() - frozen_at:.1f} s after the zombie froze"
        )
        copied_by_replacement = [k for e in replacement.of("committed") for k in e["keys"]]
        assert set(zombie_keys) <= set(copied_by_replacement), (
            "the replacement must redo the uncommitted batch"
        )
        assert not set(committed_by_zombie) & set(copied_by_replacement), "committed input copied again"

        with WireClient(b.bootstrap) as wc:
            assert wire_offset_fetch(wc, group, src, PARTITIONS, require_stable=False) == {
                part: (0, PER_PARTITION) for part in PARTITIONS
            }
            zombie_parts = {int(k.split(":")[0]) for k in frozen_keys}
            if tid_mode == "partition":
                # the replacement's InitProducerId aborted the zombie's transaction right away
                for part in zombie_parts:
                    assert "ABORT" in [e.kind for e in log_entries(wc, dst, part)], (
                        f"no ABORT marker on {part}"
                    )
        if tid_mode == "process":
            # the zombie's transaction is still open: read_committed consumers of the output are held
            # back at its first offset although the replacement committed everything
            lso = end_offsets(b.bootstrap, dst, PARTITIONS, READ_COMMITTED)
            hw = end_offsets(b.bootstrap, dst, PARTITIONS, READ_UNCOMMITTED)
            assert any(lso[p] < hw[p] for p in zombie_parts), f"LSO {lso} HW {hw}: zombie txn not open?"

        os.kill(zombie.proc.pid, signal.SIGCONT)
        rc = zombie.drain(45)
        failed = zombie.of("commit_failed")
        assert rc == 3 and failed, f"the zombie's commit did not fail: {zombie.describe()}"
        failure = failed[0]
        print(
            f"[{tid_mode}] zombie commit failed: {failure['code']} fatal={failure['fatal']}: {failure['error']}"
        )
        if tid_mode == "partition":
            assert failure["fatal"] and failure["code"] in (
                "_FENCED",
                "PRODUCER_FENCED",
                "INVALID_PRODUCER_EPOCH",
            )
        else:
            assert failure["abortable"] and failure["code"] in (
                "UNKNOWN_MEMBER_ID",
                "ILLEGAL_GENERATION",
                "FENCED_INSTANCE_ID",
            ), failure
            assert zombie.of("aborted"), zombie.describe()

        expected = Counter(f"{p}:{i}" for p in PARTITIONS for i in range(PER_PARTITION))
        committed = read_to_end(b.bootstrap, dst, PARTITIONS, READ_COMMITTED)
        got = Counter((r.key or b"").decode() for r in committed)
        assert got == expected, f"missing {expected - got}, duplicated {got - expected}"
        for r in committed:
            part, off = (r.key or b"").decode().split(":")
            assert r.partition == int(part) and r.value == f"copy:rec-{part}-{off}".encode()
        everything = Counter(
            (r.key or b"").decode() for r in read_to_end(b.bootstrap, dst, PARTITIONS, READ_UNCOMMITTED)
        )
        assert everything - expected == Counter(zombie_keys), (
            "the zombie's copies should be in the log, aborted"
        )
        assert end_offsets(b.bootstrap, dst, PARTITIONS, READ_COMMITTED) == end_offsets(
            b.bootstrap, dst, PARTITIONS, READ_UNCOMMITTED
        )
    finally:
        for p in procs:
            p.kill()
