"""The fsync of rolled segments, split so it can run off the owner's thread.

Why
---
Kafka fsyncs a rolled segment in the background (``UnifiedLog.roll`` schedules
``flushUptoOffsetExclusive(newSegment.baseOffset)`` on its scheduler) and moves the recovery point
only after that fsync. Done on the broker's event loop, these fsyncs (110-620 ms each on a busy
disk, bench/results/stall-s20.md) stalled every connection. So the log decides *what* to fsync and
which recovery point that would allow (``LogMaintenance.rolled_flush_plan``, owner's thread), any
thread runs the fsyncs (``fsync_plan``), and the owner applies the result
(``LogMaintenance.complete_rolled_flush``).

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
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

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


__all__ = ["RolledFlushPlan", "RolledFlushRunner", "fsync_plan"]
