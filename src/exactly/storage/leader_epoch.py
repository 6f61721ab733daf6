"""Leader-epoch cache of one partition (Kafka's LeaderEpochFileCache): its rules as pure functions,
and the checkpointed cache that applies them.

Each entry says "leader epoch E began at offset O". Replication answers OffsetsForLeaderEpoch from
it and followers truncate divergent tails with it (``exactly.replication.truncation``); a single
broker only ever appends epoch 0 (or higher epochs found by recovery), for which the rules below
reduce to "append a newer epoch". The file, ``leader-epoch-checkpoint``, uses Kafka's text
layout::

    0              version
    2              number of entries
    0 0            epoch start_offset
    3 1500

Kafka's rules, which the replicated cluster relies on:

* ``assign(e, off)`` is a no-op for the latest epoch continuing (``e`` == latest, ``off`` >= its
  start). Anything else first drops trailing entries whose epoch >= e or whose start >= off and
  then appends: a follower whose log was truncated gets the leader's batches re-stamping the
  range, so the same epoch at a *smaller* offset replaces the entry, and a non-monotonic tail
  goes. Negative epochs or offsets are ignored.
* ``end_offset_for(e)`` answers a pair ``(epoch, end offset)`` (OffsetsForLeaderEpoch): the
  latest epoch ends at the log end; otherwise the largest epoch <= e (or ``e`` itself when no
  older one is known) and the start of the first epoch after it; ``(-1, -1)`` when ``e`` is newer
  than everything known, is -1, or nothing is known.
* ``truncate_from_end(off)`` drops entries starting at or after ``off``; callers apply it even
  when ``off`` is at or past the log end (KAFKA-10706). ``truncate_from_start(off)`` keeps the
  epoch covering ``off``, moved up to it.

Why here and not in ``exactly.replication``: the checkpoint is storage (recovery and truncation
feed it), and the rules must be the ones the file is kept with; replication imports them from
here, storage imports nothing from replication.

Invariants
----------
* Epochs and start offsets both strictly increase (every function returns such a tuple).
* Every start offset lies in [log start offset, log end offset]: truncating the log from either
  end truncates this cache the same way.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from exactly.storage.durable import write_durably

log = logging.getLogger("exactly.storage")

LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
# The one broker leads every partition from creation on, in this epoch (replication will bump it).
INITIAL_LEADER_EPOCH = 0
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1
_VERSION = 0


@dataclass(frozen=True, slots=True)
class EpochEntry:
    epoch: int
    start_offset: int


@dataclass(frozen=True, slots=True)
class EpochEndOffset:
    """An OffsetsForLeaderEpoch answer: the largest epoch <= the one asked (or the one asked when
    nothing older is known) and the offset where the next epoch starts (the log end for the
    latest). ``(-1, -1)``: the epoch is newer than anything known, or nothing is known."""

    leader_epoch: int
    end_offset: int

    @property
    def undefined(self) -> bool:
        return self.end_offset == UNDEFINED_EPOCH_OFFSET


UNDEFINED = EpochEndOffset(UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)


# --- the rules (pure) -----------------------------------------------------------------------------


def latest_epoch(entries: Sequence[EpochEntry]) -> int:
    return entries[-1].epoch if entries else UNDEFINED_EPOCH


def assign(entries: Sequence[EpochEntry], epoch: int, start_offset: int) -> tuple[EpochEntry, ...]:
    """Record that ``epoch`` starts at ``start_offset`` (from an appended batch's
    partitionLeaderEpoch/baseOffset, or from becoming leader at the log end)."""
    current = tuple(entries)
    if epoch < 0 or start_offset < 0:
        return current
    if current:
        last = current[-1]
        if epoch == last.epoch and start_offset >= last.start_offset:
            return current  # the same epoch continuing: nothing to record
    kept = list(current)
    while kept and (kept[-1].epoch >= epoch or kept[-1].start_offset >= start_offset):
        kept.pop()
    kept.append(EpochEntry(epoch, start_offset))
    return tuple(kept)


def end_offset_for(entries: Sequence[EpochEntry], epoch: int, log_end_offset: int) -> EpochEndOffset:
    """Kafka's ``endOffsetFor``: what a leader answers to OffsetsForLeaderEpoch(epoch), and what a
    follower uses to find its own end of an epoch."""
    if epoch == UNDEFINED_EPOCH or not entries:
        return UNDEFINED
    if epoch == entries[-1].epoch:
        return EpochEndOffset(epoch, log_end_offset)
    higher = next((e for e in entries if e.epoch > epoch), None)
    if higher is None:
        return UNDEFINED
    floor = next((e for e in reversed(entries) if e.epoch <= epoch), None)
    if floor is None:
        return EpochEndOffset(epoch, higher.start_offset)
    return EpochEndOffset(floor.epoch, higher.start_offset)


def truncate_from_end(entries: Sequence[EpochEntry], end_offset: int) -> tuple[EpochEntry, ...]:
    """The log was cut at ``end_offset`` (exclusive): forget epochs starting at or after it."""
    if end_offset < 0:
        return tuple(entries)
    return tuple(e for e in entries if e.start_offset < end_offset)


def truncate_from_start(entries: Sequence[EpochEntry], start_offset: int) -> tuple[EpochEntry, ...]:
    """Segments below ``start_offset`` were deleted: the epoch covering it now starts there."""
    older = [e for e in entries if e.start_offset <= start_offset]
    newer = [e for e in entries if e.start_offset > start_offset]
    if not older:
        return tuple(entries)
    return (EpochEntry(older[-1].epoch, start_offset), *newer)


# --- the checkpointed cache -----------------------------------------------------------------------


class LeaderEpochCache:
    """The leader-epoch history of one partition, mirrored by ``leader-epoch-checkpoint``.

    Owns: ``entries`` and the checkpoint file, which every change rewrites durably (so the file is
    always the whole history), except the truncations recovery makes at load (``durable=False``),
    whose rewrite ``flush`` owes. Lifecycle: read at construction (a missing or malformed file is
    an empty history, refilled by recovery), then ``assign`` on new epochs and truncation from
    either end as the log is truncated; ``discard`` when the partition is deleted. No open
    descriptor, so nothing to close.

    Threads: the owner (the event loop) changes ``entries``; ``flush`` may run on another thread
    (the log manager's, after a load). Every change of ``entries`` and every file write happens
    under ``_lock``, so the file never goes back to older content than the newest written, and a
    rewrite owed by a deferred truncation is either done by ``flush`` or by the next durable
    change, whichever comes first. Readers of ``entries`` take no lock (a list replaced whole).
    """

    __slots__ = ("_discarded", "_lock", "entries", "path", "unflushed")

    def __init__(self, directory: Path) -> None:
        self.path = directory / LEADER_EPOCH_CHECKPOINT
        self.entries: list[EpochEntry] = self._read()
        #: ``entries`` changed by a deferred truncation (``durable=False``) and the file still holds
        #: the previous history: ``flush`` owes its rewrite (with the fsyncs).
        self.unflushed = False
        self._discarded = False
        self._lock = threading.Lock()

    def _read(self) -> list[EpochEntry]:
        """A missing or malformed file yields an empty cache: recovery re-assigns epochs from the
        batches it scans. Epochs sharing a start offset (written before these rules, by a broker
        that became leader with nothing appended in the previous epoch) keep the last one, as
        ``assign`` would have."""
        try:
            lines = self.path.read_text().splitlines()
            if int(lines[0]) != _VERSION or int(lines[1]) != len(lines) - 2:
                return []
            entries = [EpochEntry(int(e), int(o)) for e, o in (line.split() for line in lines[2:])]
        except (FileNotFoundError, IndexError, ValueError, UnicodeDecodeError):
            return []
        for a, b in itertools.pairwise(entries):
            if a.epoch >= b.epoch or a.start_offset > b.start_offset:
                return []
        folded: tuple[EpochEntry, ...] = ()
        for entry in entries:
            folded = assign(folded, entry.epoch, entry.start_offset)
        return list(folded)

    def _write_locked(self) -> None:
        """Rewrite the file as ``entries``, durably; the caller holds ``_lock``."""
        lines = [str(_VERSION), str(len(self.entries))]
        lines.extend(f"{e.epoch} {e.start_offset}" for e in self.entries)
        write_durably(self.path, ("\n".join(lines) + "\n").encode())
        self.unflushed = False

    def _replace(self, entries: tuple[EpochEntry, ...], durable: bool = True) -> None:
        if list(entries) == self.entries:
            return
        with self._lock:
            self.entries = list(entries)
            if durable:
                self._write_locked()
            else:
                self.unflushed = True

    def flush(self) -> None:
        """What deferred truncations owe: the rewrite of the file as ``entries`` with its fsyncs
        (file, then directory). May run on another thread than the cache's owner (see the class
        docstring); a no-op once the partition was deleted (``discard``) or nothing is owed."""
        with self._lock:
            if self.unflushed and not self._discarded:
                self._write_locked()

    def discard(self) -> None:
        """The partition is being deleted: from now on ``flush`` writes nothing (a rewrite owed
        to a deleted directory would recreate a file in it while it is removed). Waits for a
        ``flush`` in progress on another thread."""
        with self._lock:
            self._discarded = True

    @property
    def latest_epoch(self) -> int:
        return latest_epoch(self.entries)

    def assign(self, epoch: int, start_offset: int) -> None:
        """``assign`` of the rules, checkpointed. Dropping more than the entry being replaced
        (a non-monotonic tail) is logged, as Kafka does: it means the log was rewritten there."""
        if self.entries:
            last = self.entries[-1]
            if epoch == last.epoch and start_offset >= last.start_offset:
                return  # every append of the current epoch: the hot path, nothing to copy
        entries = assign(self.entries, epoch, start_offset)
        dropped = [e for e in self.entries if e not in entries]
        if len(dropped) > 1 or (dropped and dropped[0].start_offset != start_offset):
            log.warning(
                "%s: epoch %d at offset %d drops non-monotonic entries %s",
                self.path.parent.name,
                epoch,
                start_offset,
                [(e.epoch, e.start_offset) for e in dropped],
            )
        self._replace(entries)

    def end_offset_for(self, epoch: int, log_end_offset: int) -> EpochEndOffset:
        return end_offset_for(self.entries, epoch, log_end_offset)

    def truncate_from_end(self, end_offset: int, *, durable: bool = True) -> None:
        """The log was cut at ``end_offset``: forget epochs that started at or after it.

        ``durable=False`` (recovery at load, like Kafka's ``truncateFromEndAsyncFlush``): only
        ``entries`` change now; the file's rewrite and its fsyncs are left to ``flush``, which the
        log manager runs off the event loop once every log is open. Kafka writes the file at once
        and defers only the fsync; deferring the write too keeps a file creation and a rename per
        partition off the load (each waits for the filesystem journal: up to tens of ms on a busy
        disk). Safe for the same reason as Kafka's: what such a truncation removes lies past the
        recovered log end, the file is read only by the next load, and if a crash comes before
        ``flush`` the old file is still there and that load removes the same entries again."""
        self._replace(truncate_from_end(self.entries, end_offset), durable)

    def truncate_from_start(self, start_offset: int, *, durable: bool = True) -> None:
        """Segments below ``start_offset`` were deleted: keep the epoch covering it, moved up.
        ``durable`` as for ``truncate_from_end`` (the next load moves the same entry up again)."""
        self._replace(truncate_from_start(self.entries, start_offset), durable)


def flush_caches(caches: Sequence[LeaderEpochCache]) -> None:
    """The rewrites and fsyncs ``durable=False`` truncations at load left owing (the log manager
    runs this on a thread of its own once every log is open). A failure is logged: the next load
    truncates the same entries again."""
    for cache in caches:
        try:
            cache.flush()
        except OSError as exc:
            log.warning("could not flush %s: %s", cache.path, exc)
