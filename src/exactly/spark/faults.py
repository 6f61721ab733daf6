"""Fault hooks for the sink's crash tests (``testing.*`` writer options; never set in production).

They coordinate with a test through files in ``testing.hookDir``, because a write task runs in a
Spark Python worker, not in the test process:

* ``testing.failOnce=before-commit|after-commit`` - the first attempt of each (batch, partition)
  raises there (``failed-<stage>-<batch>-<partition>`` marks it done); Spark retries the task.
* ``testing.pauseBeforeCommit=true`` - after producing, before committing: create
  ``paused-<partition>`` and wait for ``resume-<partition>`` (at most 120 s).
* ``testing.pauseBatch=B`` - in micro-batch B only, after producing and before committing:
  create ``paused-B-<partition>`` and wait for ``resume-B`` (at most 120 s). A test kills a broker
  there: records sent, the transaction still open.
* ``testing.hangBatch=B`` - in micro-batch B, the first task to commit creates ``committed-B-<p>``
  and hangs right after its commit; a task that reaches its commit after that hangs *before* it
  (``paused-B-<p>``, its transaction left open). The test then SIGKILLs the driver: some tasks
  committed, some left open transactions, and Spark never wrote its commit log for B.
* ``testing.failAfterPrepare=P`` - two-phase mode: every attempt of the task of Spark partition P
  raises right after it prepared its transaction (a task that fails for good).
* ``testing.taskHang=B`` - two-phase mode, micro-batch B: the first task (per hook dir) to
  prepare its transaction writes its process id to ``task-prepared-B-<partition>`` and waits
  for ``task-resume-B`` (at most 120 s) before its commit message goes to the driver. A test
  SIGKILLs that Python worker there (a task that died holding a prepared transaction, which
  Spark retries), or kills a broker while the batch is prepared and then resumes the task.
* ``testing.crashAfterDecision=true`` - two-phase mode: the driver's first ``commit`` of each
  batch raises right after its decision is durable and before any transaction is committed
  (``crashed-after-decision-<batch>`` marks it done), as a driver dying there would leave it.
* ``testing.driverHang=before-decision|after-decision|mid-commit`` - two-phase mode: the first
  driver ``commit`` (per hook dir) that makes a new decision stops at that step -- before the
  decision is recorded, after it is and before any commit, or after the first of at least two
  commits -- creates ``driver-<step>-<batch>`` and waits for ``driver-resume`` (at most 120 s).
  A test SIGKILLs the driver there, or kills the broker and then resumes it, at that exact step.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

MAX_PAUSE_S = 120.0


class InjectedFault(RuntimeError):
    """Raised by ``testing.failOnce``."""


@dataclass(frozen=True)
class Faults:
    hook_dir: str | None = None
    fail_once: str | None = None
    pause_before_commit: bool = False
    pause_batch: int | None = None
    hang_batch: int | None = None
    fail_after_prepare: int | None = None
    task_hang: int | None = None
    crash_after_decision: bool = False
    driver_hang: str | None = None

    @property
    def active(self) -> bool:
        return self.hook_dir is not None

    def _path(self, name: str) -> Path:
        assert self.hook_dir is not None
        return Path(self.hook_dir) / name

    def _touch(self, name: str) -> None:
        path = self._path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()

    def _wait_for(self, name: str, timeout: float = MAX_PAUSE_S) -> None:
        deadline = time.monotonic() + timeout
        while not self._path(name).exists() and time.monotonic() < deadline:
            time.sleep(0.05)

    def _fail_once(self, stage: str, batch: int, partition: int) -> None:
        if self.fail_once != stage:
            return
        name = f"failed-{stage}-{batch}-{partition}"
        if not self._path(name).exists():
            self._touch(name)
            raise InjectedFault(f"injected failure {stage} (batch {batch}, partition {partition})")

    def before_commit(self, batch: int, partition: int) -> None:
        if not self.active:
            return
        self._fail_once("before-commit", batch, partition)
        if self.pause_before_commit:
            self._touch(f"paused-{partition}")
            self._wait_for(f"resume-{partition}")
        if self.pause_batch == batch:
            self._touch(f"paused-{batch}-{partition}")
            self._wait_for(f"resume-{batch}")
        if self.hang_batch == batch and self._path(f"claimed-{batch}").exists():
            self._touch(f"paused-{batch}-{partition}")
            self._wait_for("never")

    def after_prepare(self, batch: int, partition: int) -> None:
        if not self.active:
            return
        if self.fail_after_prepare == partition:
            raise InjectedFault(f"injected failure after prepare (batch {batch}, partition {partition})")
        if self.task_hang == batch and self._claim(f"task-claimed-{batch}"):
            ready = self._path(f"task-prepared-{batch}-{partition}")
            staged = ready.with_name(ready.name + ".tmp")
            staged.write_text(str(os.getpid()))
            staged.rename(ready)  # whole or absent: the test reads the pid as soon as it appears
            self._wait_for(f"task-resume-{batch}")

    def _claim(self, name: str) -> bool:
        """Create ``name`` in the hook dir unless it exists (atomic: one claimant wins)."""
        self._path("").mkdir(parents=True, exist_ok=True)
        try:
            self._path(name).open("x").close()
        except FileExistsError:
            return False
        return True

    def after_decision(self, batch: int) -> None:
        if not self.active or not self.crash_after_decision:
            return
        name = f"crashed-after-decision-{batch}"
        if not self._path(name).exists():
            self._touch(name)
            raise InjectedFault(f"injected driver crash after the decision of batch {batch}")

    def driver_step(self, step: str, batch: int) -> None:
        """``testing.driverHang``: stop once per hook dir at ``step`` of a new decision."""
        if not self.active or self.driver_hang != step:
            return
        if not self._claim(f"driver-claimed-{step}"):  # once per hook dir: a restarted driver runs on
            return
        self._touch(f"driver-{step}-{batch}")
        self._wait_for("driver-resume")

    def after_commit(self, batch: int, partition: int) -> None:
        if not self.active:
            return
        if self.hang_batch == batch:
            self._claim(f"claimed-{batch}")  # the first committer of the batch claims the hang
            self._touch(f"committed-{batch}-{partition}")
            self._wait_for("never")
        self._fail_once("after-commit", batch, partition)


def parse_faults(get: dict[str, str]) -> Faults:
    """From the lower-cased writer options."""
    hang = get.get("testing.hangbatch")
    fail_prepared = get.get("testing.failafterprepare")
    task_hang = get.get("testing.taskhang")
    pause = get.get("testing.pausebatch")
    return Faults(
        hook_dir=get.get("testing.hookdir"),
        fail_once=get.get("testing.failonce"),
        pause_before_commit=get.get("testing.pausebeforecommit", "false").lower() == "true",
        pause_batch=int(pause) if pause is not None else None,
        hang_batch=int(hang) if hang is not None else None,
        fail_after_prepare=int(fail_prepared) if fail_prepared is not None else None,
        task_hang=int(task_hang) if task_hang is not None else None,
        crash_after_decision=get.get("testing.crashafterdecision", "false").lower() == "true",
        driver_hang=get.get("testing.driverhang"),
    )
