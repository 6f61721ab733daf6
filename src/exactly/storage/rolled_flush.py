"""The fsync of rolled segments, split so it can run off the owner's thread.

Why
---
Kafka fsyncs a rolled segment in the background (``UnifiedLog.roll`` schedules
``flushUptoOffsetExclusive(newSegment.baseOffset)`` on its scheduler) and moves the recovery point
only after that fsync. Done on the broker's event loop, these fsyncs (110-620 ms each on a busy
disk, bench/results/stall-s20.md) stalled every connection. So the log decides *what* to fsync and
which recovery point that would allow (``LogMaintenance.rolled_flush_plan``, owner's thread), any
thread runs the fsyncs (``fsync_plan``), and the owner applies the result
(``LogMaintenance.complete_rolled_flush``). That sequence is written once, in
``rolled_flush_steps``, for any number of logs: ``flush_rolled`` drives it on the calling thread
(``LogMaintenance.flush_rolled_segments``), the broker's maintenance loop drives it with the
fsync in a worker thread (``finish_rolled_flush`` takes the result back on the loop).

Invariants
----------
* The recovery point only ever covers fsynced data: it moves to ``RolledFlushPlan.target`` only
  in ``complete_rolled_flush`` after ``fsync_plan`` returned, and never past the log end.
* While a plan is in flight its segments count as unflushed: a synchronous ``flush`` (flush.ms,
  flush.messages, DeleteRecords, ``close``) fsyncs them itself (``LogSegment.flush(force=True)``)
  before it moves the recovery point, so it never relies on the background fsync.
* A completion after the log was truncated, had segments deleted (retention, log start) or
  replaced (cleaner), or was closed or deleted is dropped: the recovery point does not move and
  the planned segments that are still in the log are marked unflushed again (the next plan or
  flush fsyncs them again; the cost is a redundant fsync, never a lost one). Every such change
  bumps the log's ``_layout_version``, which the plan records.
* A descriptor closed under ``fsync_plan`` (EBADF; EINVAL when its number now names a socket)
  is not an error: only a close or delete on the owner's thread closes one, and then the data
  was either fsynced by the close path (which forces in-flight segments) or deleted. The plan is
  then completed as not ``ok``, which moves nothing. A descriptor number reused by another
  regular file in the meantime costs one needless fsync of that file, and the completion is
  dropped by the layout version (the close or delete that freed the number bumped it, or closed
  the log).
* The producer snapshot a roll writes without its fsyncs (``producer_snapshot``) is fsynced by
  the plan whose target reaches its offset, and marked synced only when that plan completes: the
  recovery point never covers an offset whose snapshot could be lost to a machine crash.
* Any other fsync error propagates; the owner must then call ``complete_rolled_flush(plan,
  ok=False)`` so the segments are unflushed again (the recovery point stays).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from exactly.storage.durable import fsync_directory, fsync_file
from exactly.storage.producer_snapshot import snapshot_path

if TYPE_CHECKING:
    from exactly.storage.segment import LogSegment

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RolledFlushPlan:
    """What one background flush of a log's rolled segments fsyncs and what it then allows.

    ``segments``: the non-active segments handed over (their ``unflushed`` was cleared);
    ``descriptors``: the file descriptors to fsync; ``snapshots``: offsets of the producer
    snapshots in ``directory`` written at rolls without their fsyncs, at or below the target
    (fsynced by path, then the directory); ``target``: the recovery point once all that is
    fsynced (the active segment's base when planned); ``layout_version``: the log's layout
    version when planned (a completion under another version is dropped)."""

    segments: tuple[LogSegment, ...]
    descriptors: tuple[int, ...]
    snapshots: tuple[int, ...]
    directory: Path
    target: int
    layout_version: int


# A descriptor closed meanwhile: EBADF, or EINVAL when its number was reused by a socket or pipe.
_CLOSED_MEANWHILE = (errno.EBADF, errno.EINVAL)


def fsync_plan(plan: RolledFlushPlan) -> bool:
    """fsync every descriptor of ``plan``, then its snapshots and directory, from any thread.
    True when everything was fsynced. A descriptor closed meanwhile (EBADF, or EINVAL after its
    number went to a socket), a snapshot file or a partition directory deleted meanwhile is
    logged at debug and skipped, and the result is False: the caller completes the plan as not
    ``ok`` (only a close, delete, truncation, retention or cleaner swap on the owner's thread
    removes them, so the completion would be dropped anyway; see the module docstring). Other
    errors propagate."""
    complete = True
    for fd in plan.descriptors:
        try:
            os.fsync(fd)
        except OSError as exc:
            if exc.errno not in _CLOSED_MEANWHILE:
                raise
            log.debug("rolled flush: descriptor %d closed meanwhile (%s)", fd, exc)
            complete = False
    if plan.snapshots:
        for offset in plan.snapshots:
            if not fsync_file(snapshot_path(plan.directory, offset)):
                log.debug("rolled flush: snapshot %d of %s deleted meanwhile", offset, plan.directory)
                complete = False
        try:
            fsync_directory(plan.directory)
        except FileNotFoundError:
            log.debug("rolled flush: %s deleted meanwhile", plan.directory)
            complete = False
    return complete


class RolledFlushRunner:
    """Runs the fsyncs of plans for one log manager, from any one thread at a time, under a
    lock that ``stop`` (the log manager's ``close``) takes: shutdown waits for an fsync in
    flight, and no fsync starts after it (the descriptors are being closed)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stopped = False

    def fsync(self, plans: Iterable[RolledFlushPlan]) -> list[bool]:
        """``fsync_plan`` of each plan, in order; all False (nothing done) once stopped."""
        with self._lock:
            if self._stopped:
                return [False for _plan in plans]
            return [fsync_plan(plan) for plan in plans]

    def stop(self) -> None:
        with self._lock:
            self._stopped = True


def fsync_plans(plans: Iterable[RolledFlushPlan]) -> list[bool]:
    """``fsync_plan`` of each plan, in order, on the calling thread (no runner, no lock)."""
    return [fsync_plan(plan) for plan in plans]


class RolledFlushLog(Protocol):
    """The two halves a log offers (``LogMaintenance``): plan and complete, owner's thread."""

    def rolled_flush_plan(self) -> RolledFlushPlan | None: ...

    def complete_rolled_flush(self, plan: RolledFlushPlan, *, ok: bool = True) -> bool: ...


#: A log and the plan it handed over.
PlannedFlush = tuple[RolledFlushLog, RolledFlushPlan]
#: The fsync step of a batch: called with no arguments, on any thread; per plan, True if fsynced.
FsyncJob = Callable[[], list[bool]]
#: What ``rolled_flush_steps`` returns: yields the fsync job once, takes its result by ``send``.
RolledFlushSteps = Generator[FsyncJob, list[bool], None]


def plan_rolled_flushes(logs: Iterable[RolledFlushLog]) -> list[PlannedFlush]:
    """Owner's thread: each log's ``rolled_flush_plan``, skipping those with nothing to do. If
    one raises, the plans made so far are completed as not ``ok`` (nothing is left handed over
    half-done) and the error propagates."""
    plans: list[PlannedFlush] = []
    try:
        for rolled_log in logs:
            plan = rolled_log.rolled_flush_plan()
            if plan is not None:
                plans.append((rolled_log, plan))
    except BaseException:
        complete_rolled_flushes(plans, [False] * len(plans))
        raise
    return plans


def complete_rolled_flushes(plans: Sequence[PlannedFlush], fsynced: Sequence[bool]) -> None:
    """Owner's thread: each log completes its own plan with its fsync result (all False when
    the fsync step raised); the log clamps or drops it (``LogMaintenance.complete_rolled_flush``,
    by ``_layout_version``). Moved recovery points reach the checkpoint at its next write."""
    for (rolled_log, plan), ok in zip(plans, fsynced, strict=True):
        rolled_log.complete_rolled_flush(plan, ok=ok)


def rolled_flush_steps(
    logs: Iterable[RolledFlushLog], fsync: Callable[[list[RolledFlushPlan]], list[bool]]
) -> RolledFlushSteps:
    """The one sequence plan -> fsync -> complete, for every driver (sans-IO: it runs no fsync
    and awaits nothing itself). Plans on the owner's thread when first advanced (nothing to do:
    it stops at once), then yields the fsync job (``fsync`` of the plans) for the driver to run
    wherever it likes: on the calling thread (``flush_rolled``) or in a worker thread the
    broker's event loop awaits. The driver must then, on the owner's thread, either ``send``
    the job's result (each plan is completed with it) or ``throw`` the job's exception (every
    plan is completed as not ``ok``, so its segments are unflushed again and no recovery point
    moves, and the exception is re-raised). Closed without either (the driver was cancelled,
    e.g. at shutdown, while the job may still run): nothing is completed, the plans stay in
    flight, and ``LogManager.close`` waits for the job and its flush fsyncs them again."""
    plans = plan_rolled_flushes(logs)
    if not plans:
        return
    try:
        fsynced = yield partial(fsync, [plan for _log, plan in plans])
    except GeneratorExit:
        raise  # abandoned: see above
    except BaseException:
        complete_rolled_flushes(plans, [False] * len(plans))
        raise
    complete_rolled_flushes(plans, fsynced)


def finish_rolled_flush(steps: RolledFlushSteps, fsynced: list[bool] | BaseException) -> None:
    """Owner's thread: hand ``rolled_flush_steps`` the fsync job's result, or its exception
    (re-raised once the plans are completed as not ``ok``)."""
    if isinstance(fsynced, BaseException):
        steps.throw(fsynced)  # completes not ok, re-raises
        raise AssertionError("rolled_flush_steps went on after a failed fsync")  # pragma: no cover
    try:
        steps.send(fsynced)
    except StopIteration:
        return
    raise AssertionError("rolled_flush_steps yielded twice")  # pragma: no cover


def flush_rolled(
    logs: Iterable[RolledFlushLog], fsync: Callable[[list[RolledFlushPlan]], list[bool]]
) -> None:
    """The synchronous driver of ``rolled_flush_steps``: the fsync on the calling thread."""
    steps = rolled_flush_steps(logs, fsync)
    job = next(steps, None)
    if job is None:
        return
    try:
        fsynced: list[bool] | BaseException = job()
    except BaseException as exc:  # handed to the steps, which re-raise it
        fsynced = exc
    finish_rolled_flush(steps, fsynced)


__all__ = [
    "FsyncJob",
    "PlannedFlush",
    "RolledFlushLog",
    "RolledFlushPlan",
    "RolledFlushRunner",
    "RolledFlushSteps",
    "complete_rolled_flushes",
    "finish_rolled_flush",
    "flush_rolled",
    "fsync_plan",
    "fsync_plans",
    "plan_rolled_flushes",
    "rolled_flush_steps",
]
