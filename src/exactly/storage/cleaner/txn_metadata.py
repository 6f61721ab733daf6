"""Which transactional batches and markers a cleaning pass may drop (Kafka's
CleanedTransactionMetadata).

Theory of operation
-------------------
The cleaner never reads past the last stable offset, so every transaction it meets is decided, and
the aborted ones are listed, up front, by the transaction indexes. Walking the batches in offset
order, it keeps:

* a min-heap of aborted transactions by first offset; when the walk reaches a first offset, that
  producer becomes *ongoing aborted* (its transactional data from there to its ABORT marker is
  aborted data);
* the set of producers with *ongoing committed* data (transactional data not aborted).

Rules (the return value says whether the batch may be discarded):

* transactional data of an ongoing-aborted producer: discard, and remember a batch was seen;
* other transactional data: keep; the producer joins the ongoing-committed set;
* an ABORT marker: kept while this pass saw data of its transaction, and then its aborted-transaction
  entry is re-emitted into the cleaned segment's transaction index (``on_retained_abort``);
  otherwise discardable;
* a COMMIT marker: discardable only when this pass saw no data of its transaction;
* an empty control batch (its marker was cleaned away before): discardable.

A discardable marker is not deleted at once: the batch filter first gives it a delete horizon and
drops it only after that (``delete.retention.ms``), so a consumer reading within that time still
sees it. Hence the marker of an aborted transaction outlives its data by at least the retention.

Invariants: batches are offered in strictly increasing offset order; one instance spans one pass
(all the groups of segments the pass rewrites, or the offset-map build).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from exactly.records.batch import BatchHeader
from exactly.records.control import ControlType
from exactly.storage.txn_index import AbortedTxnEntry


@dataclass(slots=True)
class _OngoingAborted:
    entry: AbortedTxnEntry
    saw_batch: bool = False


@dataclass(slots=True)
class CleanedTransactionMetadata:
    """The walk's transaction state; ``on_retained_abort`` receives the index entries to keep."""

    on_retained_abort: Callable[[AbortedTxnEntry], None] | None = None
    _heap: list[tuple[int, int, AbortedTxnEntry]] = field(default_factory=list)
    _seq: int = 0
    _ongoing_aborted: dict[int, _OngoingAborted] = field(default_factory=dict)
    _ongoing_committed: set[int] = field(default_factory=set)

    def add_aborted_transactions(self, entries: Iterable[AbortedTxnEntry]) -> None:
        for entry in entries:
            self._seq += 1
            heapq.heappush(self._heap, (entry.first_offset, self._seq, entry))

    def _consume_aborted_up_to(self, offset: int) -> None:
        while self._heap and self._heap[0][0] <= offset:
            _first, _seq, entry = heapq.heappop(self._heap)
            # setdefault: the same transaction may be listed twice (it overlaps two segments).
            self._ongoing_aborted.setdefault(entry.producer_id, _OngoingAborted(entry))

    def on_batch_read(self, header: BatchHeader) -> bool:
        """A data batch; True when it belongs to an aborted transaction (discardable)."""
        self._consume_aborted_up_to(header.last_offset)
        if not header.is_transactional:
            return False
        aborted = self._ongoing_aborted.get(header.producer_id)
        if aborted is not None:
            aborted.saw_batch = True
            return True
        self._ongoing_committed.add(header.producer_id)
        return False

    def on_control_batch_read(self, header: BatchHeader, marker: ControlType | None) -> bool:
        """A control batch whose marker is ``marker`` (None: the batch is empty); True when the
        marker may be discarded (after its delete horizon)."""
        self._consume_aborted_up_to(header.last_offset)
        if marker is None:
            return True
        pid = header.producer_id
        if marker is ControlType.ABORT:
            aborted = self._ongoing_aborted.pop(pid, None)
            if aborted is not None and aborted.saw_batch:
                if self.on_retained_abort is not None:
                    self.on_retained_abort(aborted.entry)
                return False
            return True
        if pid in self._ongoing_committed:
            self._ongoing_committed.discard(pid)
            return False
        return True
