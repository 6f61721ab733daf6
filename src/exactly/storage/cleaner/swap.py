"""Replacing segments by a cleaned one so that a crash at any moment leaves either the old or the
new segments (Kafka's LocalLog.replaceSegments and the swap recovery of LogLoader.load).

The protocol
------------
The cleaner writes the new segment as ``<base>.log.cleaned`` (and ``.index.cleaned``,
``.timeindex.cleaned``, ``.txnindex.cleaned``) and fsyncs it. Then:

1. ``.cleaned`` -> ``.swap``: indexes first, the log file last; directory fsync. From the moment
   ``<base>.log.swap`` exists the new segment is *committed*: recovery will finish the swap.
2. every old segment's files -> ``.deleted``.
3. ``.swap`` -> final names: the log file first, then its indexes; directory fsync.
4. the ``.deleted`` files are removed.

Recovery (``recover_swaps``, run before a partition's segments are opened):

* ``*.deleted`` files are removed (old segments whose replacement is committed);
* ``*.cleaned`` files are removed (a pass that never committed: its work is simply lost), and so
  are ``*.swap`` files whose base offset is at or above the smallest ``.cleaned`` base (index files
  renamed in step 1 before the crash, whose log file never was);
* for the remaining ``*.log.swap`` files, every non-swap segment file whose base offset lies in
  [smallest swap base, largest swap next offset) is removed: those are old segments step 2 had not
  reached yet;
* the remaining ``*.swap`` files are renamed to their final names.

Why the rename orders: in step 1 a ``.log.swap`` must imply complete ``.swap`` indexes (else the
new segment's transaction index could be dropped); in step 3 the log file leaves the swap state
first, because while a ``.log.swap`` exists recovery deletes non-swap files in its range, which
would include indexes already given their final names.

Test hooks: ``replace_segments`` calls ``hook(step)`` after each step (``SwapStep``); a test
raises there to stop the swap as a crash would and reopens the log from disk.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from exactly.storage.durable import fsync_directory
from exactly.storage.segment import ALL_SUFFIXES, LOG_SUFFIX, LogSegment

log = logging.getLogger(__name__)

CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
DELETED_SUFFIX = ".deleted"


class SwapStep(enum.Enum):
    CLEANED_FLUSHED = "cleaned_flushed"  # the .cleaned segment is complete on disk
    SWAP_INDEXES_RENAMED = "swap_indexes_renamed"  # inside step 1: indexes are .swap, the log is not
    SWAP_COMMITTED = "swap_committed"  # step 1 done: <base>.log.swap exists
    OLD_SEGMENT_RENAMED = "old_segment_renamed"  # step 2, after each old segment
    NEW_LOG_RENAMED = "new_log_renamed"  # inside step 3: the log has its final name, indexes not
    SWAP_DONE = "swap_done"  # step 3 done
    OLD_FILES_DELETED = "old_files_deleted"  # step 4 done


SwapHook = Callable[[SwapStep], None]


def _no_hook(_step: SwapStep) -> None:
    return None


def _rename_to_swap(segment: LogSegment, hook: SwapHook) -> None:
    """Step 1, split in two so a test can stop between the indexes and the log file."""
    for index in (segment.offset_index, segment.time_index, segment.txn_index):
        target = index.path.with_name(index.path.name[: -len(CLEANED_SUFFIX)] + SWAP_SUFFIX)
        if index.path.exists():
            index.path.replace(target)
        index.path = target
    hook(SwapStep.SWAP_INDEXES_RENAMED)
    target = segment.log_path.with_name(segment.log_path.name[: -len(CLEANED_SUFFIX)] + SWAP_SUFFIX)
    segment.log_path.replace(target)
    segment.log_path = target
    segment.file_suffix = SWAP_SUFFIX


def _rename_from_swap(segment: LogSegment, hook: SwapHook) -> None:
    """Step 3, split in two so a test can stop between the log file and the indexes."""
    target = segment.log_path.with_name(segment.log_path.name[: -len(SWAP_SUFFIX)])
    segment.log_path.replace(target)
    segment.log_path = target
    hook(SwapStep.NEW_LOG_RENAMED)
    for index in (segment.offset_index, segment.time_index, segment.txn_index):
        target = index.path.with_name(index.path.name[: -len(SWAP_SUFFIX)])
        if index.path.exists():
            index.path.replace(target)
        index.path = target
    segment.file_suffix = ""


def replace_segment_files(
    directory: Path, cleaned: LogSegment, old: Sequence[LogSegment], hook: SwapHook | None = None
) -> None:
    """Swap the flushed ``cleaned`` segment in for ``old`` on disk (steps 1-4). The caller then
    updates its segment list; ``old`` segments are closed here."""
    replace_segment_groups(directory, [(cleaned, old)], hook)


def replace_segment_groups(
    directory: Path,
    groups: Sequence[tuple[LogSegment, Sequence[LogSegment]]],
    hook: SwapHook | None = None,
) -> None:
    """Swap several cleaned segments in at once, each for its old segments: every step for every
    group, in offset order, with one directory fsync per step instead of one per group (a pass
    over 75 full segments has 75 groups; each fsync is milliseconds on the event loop).

    Crash-equivalent to swapping the groups one by one, because the groups of one pass are
    consecutive and so cover one contiguous range: a crash inside step 1 leaves a prefix of the
    groups committed (recovery completes those and drops the rest, whose ``.cleaned`` files are
    still there); after step 1 every group is committed, and recovery's range [smallest swap base,
    largest swap end) is exactly the union of their old segments.

    ``commit_segment_groups`` then ``finish_segment_groups``: the broker runs the first on the
    log's owner (it must see the segment list unchanged) and the second off it."""
    commit_segment_groups(directory, groups, hook)
    finish_segment_groups(directory, groups, hook)


def commit_segment_groups(
    directory: Path,
    groups: Sequence[tuple[LogSegment, Sequence[LogSegment]]],
    hook: SwapHook | None = None,
) -> None:
    """Steps 1-3 without step 3's directory fsync: the renames, with the one fsync the protocol
    cannot do without (step 1's, the commit point: a ``.deleted`` old segment must never be on
    disk without its committed ``.swap`` replacement). On return the old segments are closed and
    the cleaned ones carry their final names; the caller updates its segment list."""
    step = hook or _no_hook
    for cleaned, _old in groups:
        if cleaned.file_suffix != CLEANED_SUFFIX:
            raise ValueError(f"{cleaned} is not a cleaned segment")
    step(SwapStep.CLEANED_FLUSHED)
    for cleaned, _old in groups:
        _rename_to_swap(cleaned, step)
    fsync_directory(directory)
    step(SwapStep.SWAP_COMMITTED)
    for _cleaned, old in groups:
        for segment in old:
            segment.close()
            segment.change_file_suffixes("", DELETED_SUFFIX, log_last=False)
            step(SwapStep.OLD_SEGMENT_RENAMED)
    for cleaned, _old in groups:
        _rename_from_swap(cleaned, step)


def finish_segment_groups(
    directory: Path,
    groups: Sequence[tuple[LogSegment, Sequence[LogSegment]]],
    hook: SwapHook | None = None,
) -> None:
    """Step 3's directory fsync and step 4 (the ``.deleted`` old files removed), after
    ``commit_segment_groups``. Touches only files no segment list refers to any more, so it may
    run on any thread, later (Kafka too deletes replaced segments asynchronously). Until its
    fsync a crash finds the directory somewhere inside steps 2-3, which recovery completes: the
    same as a crash just before step 3's fsync when both ran in one go."""
    step = hook or _no_hook
    fsync_directory(directory)
    step(SwapStep.SWAP_DONE)
    for _cleaned, old in groups:
        for segment in old:
            segment.delete()
    step(SwapStep.OLD_FILES_DELETED)


def _base_of(path: Path) -> int | None:
    stem = path.name[:20]
    if len(path.name) > 20 and stem.isdigit() and path.name[20] == ".":
        return int(stem)
    return None


def _is_segment_file(name: str, suffix: str) -> bool:
    return any(name.endswith(kind + suffix) for kind in ALL_SUFFIXES)


def _swap_log_next_offset(directory: Path, base: int) -> int:
    """One past the last offset of a committed ``.log.swap`` (a scan of its batch headers)."""
    segment = LogSegment.open(
        directory, base, index_interval_bytes=1 << 30, index_max_bytes=8, now_ms=0, file_suffix=SWAP_SUFFIX
    )
    try:
        next_offset = base
        for _position, header in segment.scan(0):
            next_offset = header.next_offset
        return next_offset
    finally:
        segment.close()


def recover_swaps(directory: Path) -> int:
    """Finish or roll back swaps a crash interrupted (see the module docstring). Returns the
    number of swapped-in segments recovered."""
    cleaned: list[Path] = []
    swaps: list[Path] = []
    for path in directory.iterdir():
        name = path.name
        if _base_of(path) is None:
            continue
        if _is_segment_file(name, DELETED_SUFFIX):
            path.unlink(missing_ok=True)
        elif _is_segment_file(name, CLEANED_SUFFIX):
            cleaned.append(path)
        elif _is_segment_file(name, SWAP_SUFFIX):
            swaps.append(path)
    min_cleaned = min((b for p in cleaned if (b := _base_of(p)) is not None), default=None)
    for path in cleaned:
        log.info("deleting %s: a cleaning pass that did not complete", path.name)
        path.unlink(missing_ok=True)
    if min_cleaned is not None:
        for path in [p for p in swaps if (_base_of(p) or 0) >= min_cleaned]:
            log.info("deleting %s: part of a swap that did not commit", path.name)
            path.unlink(missing_ok=True)
            swaps.remove(path)
    log_swaps = [p for p in swaps if p.name.endswith(LOG_SUFFIX + SWAP_SUFFIX)]
    if log_swaps:
        bases = [b for p in log_swaps if (b := _base_of(p)) is not None]
        low = min(bases)
        high = max(_swap_log_next_offset(directory, b) for b in bases)
        for path in directory.iterdir():
            base = _base_of(path)
            if base is None or not any(path.name.endswith(kind) for kind in ALL_SUFFIXES):
                continue
            if low <= base < high:
                log.info("deleting %s: replaced by a committed swap", path.name)
                path.unlink(missing_ok=True)
    for path in swaps:
        log.info("completing the swap of %s", path.name)
        path.replace(path.with_name(path.name[: -len(SWAP_SUFFIX)]))
    if swaps:
        fsync_directory(directory)
    return len(log_swaps)
