"""The per-batch and per-record decisions of a cleaning pass, and the batch written for each
(Kafka's LogCleaner.cleanInto filter and MemoryRecords.filterTo).

Theory of operation
-------------------
Each batch of the segments being rewritten gets one of three *batch retentions*, checked in order:

1. ``RETAIN_EMPTY``: the batch holds the last data of a producer that is still active (its last
   sequence, needed for duplicate detection after a restart), or, when that producer's last entry
   is a marker, it is a control batch with the producer's current epoch (needed for fencing); or it
   is the last batch of the cleaning round (its next offset is the round's upper bound), so the
   last offset stays known. Such a batch is kept even when no record survives: as a header with no
   record.
2. ``DELETE``: aborted data, or a discardable marker (``txn_metadata``) whose delete horizon has
   passed. The batch disappears.
3. ``DELETE_EMPTY``: records are filtered; the batch goes when none is left.

A record survives when (a) its batch is not being discarded (a discarded batch kept by rule 1
keeps no record), and (b) it is a control record, or its offset is past the offset map's latest
offset (the pass did not index it), or it has a key, its offset is the key's latest in the map
(a key the map never saw counts as latest), and it has a value or is a tombstone whose batch
has no delete horizon yet or one that has not passed. Keyless records in a compacted log are
dropped (Kafka refuses them at produce time; old data may hold some).

A batch whose records all survive is copied byte for byte, unless it holds a tombstone or is a
discardable marker without a delete horizon: then it is rebuilt with horizon ``now +
delete.retention.ms``, which starts the clock for removing them (KIP-534). Tombstones and markers
therefore need two passes to go, and the horizon comes from the clean time, never from the record
timestamps.

Replicas (cluster mode): ``replica_floor`` is an offset below which every replica in the
partition's assignment is known to have the log (``replication.compaction_floor``). A tombstone or a
discardable marker goes only once its horizon has passed *and* its offset is below the floor, and
an emptied batch of a producer at or above the floor stays as an empty header, so a replica that
was away longer than ``delete.retention.ms`` still fetches every delete, every transaction's fate
and every producer's sequence it has not seen (Kafka compacts each replica by time alone: such a
replica misses them). ``None`` (a single broker) gates nothing: Kafka's rules exactly.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from exactly.records.batch import BatchHeader
from exactly.records.builder import Record, decode_batch
from exactly.records.control import ControlType, read_control_marker
from exactly.records.rebuild import (
    build_empty_batch,
    build_retained_batch,
    delete_horizon_of,
    record_key_states,
    record_keys,
)
from exactly.storage.cleaner.offset_map import OffsetMap
from exactly.storage.cleaner.txn_metadata import CleanedTransactionMetadata

T = TypeVar("T")
#: Called every ``TICK_RECORDS`` records a pass decodes or maps: the worker's CPU duty cycle
#: (``worker.CpuLimiter``) sleeps there when it is over its share. Per batch is far too coarse: a
#: 1 MB batch of 100 B records is 8,000 records and 40 ms of CPU, a burst that holds a core the
#: broker's clients are woken on (they wait for the scheduler's tick, 4 ms at HZ=250).
Tick = Callable[[], None]
#: About 0.13 ms of decoding at ~4 us a record: bursts stay near the duty cycle's own length
#: (0.25 ms, ``duty_cycle.MAX_BURST_S``); 128 before session 18. A tick is two clock reads.
TICK_RECORDS = 32


def no_tick() -> None:
    return None


def ticked(items: Iterable[T], tick: Tick, every: int = TICK_RECORDS) -> list[T]:
    """``list(items)``, calling ``tick`` after every ``every`` items (in chunks: no per-item cost)."""
    it = iter(items)
    out: list[T] = []
    while chunk := list(itertools.islice(it, every)):
        out.extend(chunk)
        tick()
    return out


class BatchRetention(enum.Enum):
    RETAIN_EMPTY = "retain_empty"
    DELETE = "delete"
    DELETE_EMPTY = "delete_empty"


@dataclass(frozen=True, slots=True)
class LastRecord:
    """An active producer's last entry in the log: the last offset of its last data batch (-1
    when its last entry is a marker) and its epoch (Kafka's LastRecord)."""

    last_data_offset: int
    producer_epoch: int


@dataclass(frozen=True, slots=True)
class FilterContext:
    """What stays fixed for one cleaning pass."""

    offset_map: OffsetMap
    active_producers: Mapping[int, LastRecord]
    upper_bound_offset: int  # the round's first uncleanable offset
    now_ms: int
    delete_retention_ms: int
    tick: Tick = no_tick  # see ``Tick``
    #: Offsets below it are on every replica of the partition; None: no gate (a single broker).
    replica_floor: int | None = None

    def replicated(self, offset: int) -> bool:
        """Every replica has ``offset`` (always, without a floor)."""
        return self.replica_floor is None or offset < self.replica_floor


@dataclass(frozen=True, slots=True)
class FilteredBatch:
    """The outcome for one batch: the bytes to write (None: nothing), records read and kept."""

    data: bytes | memoryview | None
    records_read: int
    records_kept: int
    rebuilt: bool


class UncleanableBatchError(Exception):
    """A batch the cleaner cannot read (an unsupported compression codec, garbled records): the
    partition is marked uncleanable rather than compacted wrongly."""


def control_type_of(buf: bytes | memoryview, header: BatchHeader) -> ControlType | None:
    """The marker of a control batch, None when it is empty (cleaned before)."""
    if header.record_count == 0:
        return None
    try:
        return read_control_marker(buf, header).type
    except (ValueError, IndexError) as exc:
        raise UncleanableBatchError(
            f"unreadable control batch at offset {header.base_offset}: {exc}"
        ) from None


def decode_records(buf: bytes | memoryview, header: BatchHeader, tick: Tick = no_tick) -> list[Record]:
    try:
        return decode_batch(buf, header.position, tick=tick)[1]
    except (ValueError, IndexError, OSError, EOFError) as exc:
        raise UncleanableBatchError(f"cannot read the batch at offset {header.base_offset}: {exc}") from None


def map_keys(
    buf: bytes | memoryview, header: BatchHeader, tick: Tick = no_tick
) -> list[tuple[int, bytes | None]]:
    """(offset, key) of each record, for the offset map (values are not read)."""
    try:
        return ticked(record_keys(buf, header), tick)
    except (ValueError, IndexError, OSError, EOFError) as exc:
        raise UncleanableBatchError(f"cannot read the batch at offset {header.base_offset}: {exc}") from None


def key_states(
    buf: bytes | memoryview, header: BatchHeader, tick: Tick = no_tick
) -> list[tuple[int, bytes | None, bool]]:
    """(offset, key, is_tombstone) of each record (values are not read)."""
    try:
        return ticked(record_key_states(buf, header), tick)
    except (ValueError, IndexError, OSError, EOFError) as exc:
        raise UncleanableBatchError(f"cannot read the batch at offset {header.base_offset}: {exc}") from None


def _is_last_of_active_producer(header: BatchHeader, producers: Mapping[int, LastRecord]) -> bool:
    last = producers.get(header.producer_id)
    if last is None:
        return False
    if last.last_data_offset >= 0:
        return header.last_offset == last.last_data_offset
    return header.is_control and header.producer_epoch == last.producer_epoch


def _retain_record(
    ctx: FilterContext, offset: int, key: bytes | None, tombstone: bool, horizon: int | None
) -> bool:
    if offset > ctx.offset_map.latest_offset:
        return True
    if key is None:
        return False
    if offset < ctx.offset_map.get(key):
        return False
    return not tombstone or horizon is None or ctx.now_ms < horizon or not ctx.replicated(offset)


def filter_batch(
    buf: bytes | memoryview, header: BatchHeader, ctx: FilterContext, txn: CleanedTransactionMetadata
) -> FilteredBatch:
    """Decide one batch (``header.position`` is its place in ``buf``) and build what to write."""
    horizon = delete_horizon_of(header)
    if header.is_control:
        marker = control_type_of(buf, header)
        can_discard = txn.on_control_batch_read(header, marker)
        discard_records = (
            can_discard
            and horizon is not None
            and horizon <= ctx.now_ms
            and ctx.replicated(header.last_offset)
        )
    else:
        can_discard = txn.on_batch_read(header)
        discard_records = can_discard
    marker_for_empty_txn = can_discard and header.is_control

    last_of_producer = header.producer_id >= 0 and _is_last_of_active_producer(header, ctx.active_producers)
    # The last batch of the round stays too, so the last offset stays known.
    if last_of_producer or header.next_offset == ctx.upper_bound_offset:
        retention = BatchRetention.RETAIN_EMPTY
    elif discard_records:
        retention = BatchRetention.DELETE
    else:
        retention = BatchRetention.DELETE_EMPTY
    if retention is BatchRetention.DELETE:
        return FilteredBatch(None, header.record_count, 0, False)

    if discard_records:
        kept: list[Record] = []
        read = header.record_count
    elif header.is_control:
        kept = decode_records(buf, header) if header.record_count else []
        read = len(kept)
    else:
        # Decide from keys alone; decode values only when the batch must be rebuilt (some records
        # go, or a kept tombstone needs a delete horizon). Most batches of a compacted log are
        # dropped whole or copied whole, and a full decode is most of a pass's cost.
        states = key_states(buf, header, ctx.tick)
        read = len(states)
        retain = ticked((_retain_record(ctx, off, key, tomb, horizon) for off, key, tomb in states), ctx.tick)
        kept_count = sum(retain)
        tombstone_kept = any(tomb for (_o, _k, tomb), r in zip(states, retain, strict=True) if r)
        if kept_count == read and kept_count and not (tombstone_kept and horizon is None):
            with memoryview(buf) as view:
                data = bytes(view[header.position : header.position + header.size])
            return FilteredBatch(data, read, read, False)
        if kept_count:
            records = decode_records(buf, header, ctx.tick)
            if len(records) != read:
                raise UncleanableBatchError(f"garbled batch at offset {header.base_offset}")
            kept = [r for r, keep in zip(records, retain, strict=True) if keep]
        else:
            kept = []

    if kept:
        has_tombstone = any(r.value is None for r in kept) and not header.is_control
        needs_horizon = (has_tombstone or marker_for_empty_txn) and horizon is None
        if len(kept) == read and not needs_horizon:
            with memoryview(buf) as view:
                data = bytes(view[header.position : header.position + header.size])
            return FilteredBatch(data, read, len(kept), False)
        new_horizon = ctx.now_ms + ctx.delete_retention_ms if needs_horizon else horizon
        return FilteredBatch(
            build_retained_batch(header, kept, delete_horizon_ms=new_horizon, tick=ctx.tick),
            read,
            len(kept),
            True,
        )
    if retention is BatchRetention.RETAIN_EMPTY or (
        header.producer_id >= 0 and not ctx.replicated(header.last_offset)
    ):
        # (the second case: a replica still to fetch it learns the producer's sequence and epoch)
        return FilteredBatch(build_empty_batch(header), read, 0, True)
    return FilteredBatch(None, read, 0, False)
