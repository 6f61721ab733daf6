"""Leader-epoch checkpoint of one partition (Kafka's LeaderEpochFileCache).

Each entry says "leader epoch E began at offset O". A single broker only ever appends new epochs,
but keeping the history now lets replication later answer OffsetsForLeaderEpoch and let followers
truncate divergent tails. The file, ``leader-epoch-checkpoint``, uses Kafka's text layout::

    0              version
    2              number of entries
    0 0            epoch start_offset
    3 1500

Invariants
----------
* Epochs and start offsets both strictly increase.
* Every start offset lies in [log start offset, log end offset]: truncating the log from either
  end truncates this cache the same way.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

from exactly.storage.durable import write_durably

LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
# The one broker leads every partition from creation on, in this epoch (replication will bump it).
INITIAL_LEADER_EPOCH = 0
_VERSION = 0


@dataclass(frozen=True, slots=True)
class EpochEntry:
    epoch: int
    start_offset: int


class LeaderEpochCache:
    """The leader-epoch history of one partition, mirrored by ``leader-epoch-checkpoint``.

    Owns: ``entries`` and the checkpoint file, which every change rewrites durably (so the file is
    always the whole history). Lifecycle: read at construction (a missing or malformed file is an
    empty history, refilled by recovery), then ``assign`` on new epochs and truncation from either
    end as the log is truncated. No open descriptor, so nothing to close.
    """

    __slots__ = ("entries", "path")

    def __init__(self, directory: Path) -> None:
        self.path = directory / LEADER_EPOCH_CHECKPOINT
        self.entries: list[EpochEntry] = self._read()

    def _read(self) -> list[EpochEntry]:
        """A missing or malformed file yields an empty cache: recovery re-assigns epochs from
        the batches it scans, and a single broker needs nothing older."""
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
        return entries

    def _write(self) -> None:
        lines = [str(_VERSION), str(len(self.entries))]
        lines.extend(f"{e.epoch} {e.start_offset}" for e in self.entries)
        write_durably(self.path, ("\n".join(lines) + "\n").encode())

    @property
    def latest_epoch(self) -> int:
        return self.entries[-1].epoch if self.entries else -1

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that ``epoch`` starts at ``start_offset`` if it is newer than the latest."""
        if epoch < 0 or epoch <= self.latest_epoch:
            return
        if self.entries and start_offset < self.entries[-1].start_offset:
            return
        self.entries.append(EpochEntry(epoch, start_offset))
        self._write()

    def end_offset_for(self, epoch: int, log_end_offset: int) -> int:
        """Kafka's endOffsetFor: the start offset of the first epoch after ``epoch`` (the log end
        for the latest), -1 when ``epoch`` predates everything known."""
        for i, entry in enumerate(self.entries):
            if entry.epoch > epoch:
                return -1 if i == 0 else entry.start_offset
        return log_end_offset if self.entries else -1

    def truncate_from_end(self, end_offset: int) -> None:
        """The log was cut at ``end_offset``: forget epochs that started at or after it."""
        keep = [e for e in self.entries if e.start_offset < end_offset]
        if len(keep) != len(self.entries):
            self.entries = keep
            self._write()

    def truncate_from_start(self, start_offset: int) -> None:
        """Segments below ``start_offset`` were deleted: keep the epoch covering it, moved up."""
        older = [e for e in self.entries if e.start_offset < start_offset]
        if not older:
            return
        newer = [e for e in self.entries if e.start_offset >= start_offset]
        if newer and newer[0].start_offset == start_offset:
            self.entries = newer
        else:
            self.entries = [EpochEntry(older[-1].epoch, start_offset), *newer]
        self._write()
