"""The leader-epoch cache: Kafka's rules (LeaderEpochFileCacheTest's cases) as pure functions, and
the checkpointed cache that applies them."""

from __future__ import annotations

import itertools
import logging
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactly.storage.leader_epoch import (
    LEADER_EPOCH_CHECKPOINT,
    UNDEFINED,
    EpochEndOffset,
    LeaderEpochCache,
    assign,
    end_offset_for,
    truncate_from_end,
    truncate_from_start,
)
from exactly.storage.leader_epoch import EpochEntry as E

CACHE = (E(2, 6), E(3, 8), E(5, 10))


@pytest.mark.parametrize(
    ("entries", "epoch", "offset", "expected"),
    [
        ((), 0, 0, (E(0, 0),)),
        (CACHE, 5, 12, CACHE),  # same epoch continuing: no-op
        (CACHE, 6, 12, (*CACHE, E(6, 12))),
        # same epoch at a smaller offset (re-stamped after truncation) replaces the entry
        (CACHE, 5, 9, (E(2, 6), E(3, 8), E(5, 9))),
        # an older epoch or an offset not after the tail drops the non-monotonic tail first
        (CACHE, 4, 11, (E(2, 6), E(3, 8), E(4, 11))),
        (CACHE, 6, 8, (E(2, 6), E(6, 8))),
        (CACHE, -1, 5, CACHE),  # negative values are ignored
    ],
)
def test_assign(entries: tuple[E, ...], epoch: int, offset: int, expected: tuple[E, ...]) -> None:
    assert assign(entries, epoch, offset) == expected


@pytest.mark.parametrize(
    ("epoch", "expected"),
    [
        (5, EpochEndOffset(5, 15)),  # latest epoch: the log end
        (3, EpochEndOffset(3, 10)),  # end = the next epoch's start
        (4, EpochEndOffset(3, 10)),  # unknown epoch: the floor epoch and the next start
        (1, EpochEndOffset(1, 6)),  # older than everything: asked epoch, first start
        (6, UNDEFINED),  # newer than everything known
        (-1, UNDEFINED),
    ],
)
def test_end_offset_for(epoch: int, expected: EpochEndOffset) -> None:
    assert end_offset_for(CACHE, epoch, 15) == expected


def test_end_offset_for_empty_cache_is_undefined() -> None:
    assert end_offset_for((), 0, 10) == UNDEFINED


def test_truncate_from_end_drops_entries_starting_at_or_after() -> None:
    assert truncate_from_end(CACHE, 10) == (E(2, 6), E(3, 8))
    assert truncate_from_end(CACHE, 9) == (E(2, 6), E(3, 8))
    assert truncate_from_end(CACHE, 100) == CACHE


def test_truncate_from_start_moves_the_covering_epoch_up() -> None:
    assert truncate_from_start(CACHE, 9) == (E(3, 9), E(5, 10))
    assert truncate_from_start(CACHE, 8) == (E(3, 8), E(5, 10))
    assert truncate_from_start(CACHE, 2) == CACHE


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("assign"), st.integers(0, 8), st.integers(0, 60)),
            st.tuples(st.just("end"), st.integers(0, 60), st.just(0)),
            st.tuples(st.just("start"), st.integers(0, 60), st.just(0)),
        ),
        max_size=40,
    )
)
def test_any_sequence_keeps_epochs_and_offsets_strictly_increasing(ops: list[tuple[str, int, int]]) -> None:
    entries: tuple[E, ...] = ()
    for op, a, b in ops:
        if op == "assign":
            entries = assign(entries, a, b)
            assert entries[-1] == E(a, b) or (entries[-1].epoch == a and entries[-1].start_offset <= b)
        elif op == "end":
            entries = truncate_from_end(entries, a)
            assert all(e.start_offset < a for e in entries)
        else:
            entries = truncate_from_start(entries, a)
        assert all(
            x.epoch < y.epoch and x.start_offset < y.start_offset for x, y in itertools.pairwise(entries)
        )


# --- the checkpointed cache applies the same rules ---------------------------------------------


def checkpoint(path: Path) -> list[str]:
    return (path / LEADER_EPOCH_CHECKPOINT).read_text().splitlines()


def test_cache_replaces_the_latest_epoch_at_a_smaller_offset_and_persists_it(tmp_path: Path) -> None:
    cache = LeaderEpochCache(tmp_path)
    cache.assign(0, 0)
    cache.assign(2, 10)
    cache.assign(2, 12)  # the epoch continuing: nothing written
    assert checkpoint(tmp_path) == ["0", "2", "0 0", "2 10"]
    cache.assign(2, 7)  # a follower re-stamped by its leader after a truncation
    assert cache.entries == [E(0, 0), E(2, 7)]
    assert checkpoint(tmp_path) == ["0", "2", "0 0", "2 7"]
    assert LeaderEpochCache(tmp_path).entries == [E(0, 0), E(2, 7)]


def test_cache_drops_a_non_monotonic_tail_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = LeaderEpochCache(tmp_path)
    for epoch, offset in ((0, 0), (3, 5), (4, 9)):
        cache.assign(epoch, offset)
    with caplog.at_level(logging.WARNING, logger="exactly.storage"):
        cache.assign(2, 5)
    assert cache.entries == [E(0, 0), E(2, 5)]
    assert LeaderEpochCache(tmp_path).entries == [E(0, 0), E(2, 5)]
    assert "drops non-monotonic entries [(3, 5), (4, 9)]" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="exactly.storage"):
        cache.assign(3, 5)  # a new leader at the same offset, nothing written in epoch 2: expected
    assert cache.entries == [E(0, 0), E(3, 5)]
    assert caplog.text == ""


def test_cache_answers_end_offsets_as_pairs(tmp_path: Path) -> None:
    cache = LeaderEpochCache(tmp_path)
    for entry in CACHE:
        cache.assign(entry.epoch, entry.start_offset)
    assert cache.end_offset_for(5, 15) == EpochEndOffset(5, 15)
    assert cache.end_offset_for(4, 15) == EpochEndOffset(3, 10)
    assert cache.end_offset_for(1, 15) == EpochEndOffset(1, 6)  # the single broker's rules said -1
    assert cache.end_offset_for(9, 15) == UNDEFINED  # they said the log end


def test_cache_truncation_from_both_ends_is_persisted(tmp_path: Path) -> None:
    cache = LeaderEpochCache(tmp_path)
    for entry in CACHE:
        cache.assign(entry.epoch, entry.start_offset)
    cache.truncate_from_end(10)
    cache.truncate_from_start(7)
    assert LeaderEpochCache(tmp_path).entries == [E(2, 7), E(3, 8)]


def test_a_deferred_truncation_leaves_the_file_to_its_flush(tmp_path: Path) -> None:
    cache = LeaderEpochCache(tmp_path)
    for entry in CACHE:
        cache.assign(entry.epoch, entry.start_offset)
    assert not cache.unflushed
    cache.truncate_from_end(10, durable=False)
    assert cache.unflushed and cache.entries == [E(2, 6), E(3, 8)]
    # the file still holds the previous history: a crash now makes the next load truncate again
    assert LeaderEpochCache(tmp_path).entries == list(CACHE)
    cache.flush()
    assert not cache.unflushed
    assert LeaderEpochCache(tmp_path).entries == cache.entries
    assert not (tmp_path / (LEADER_EPOCH_CHECKPOINT + ".tmp")).exists()
    cache.truncate_from_start(7, durable=False)
    cache.assign(4, 12)  # a durable write settles what was owed
    assert not cache.unflushed
    assert LeaderEpochCache(tmp_path).entries == [E(2, 7), E(3, 8), E(4, 12)]
    cache.flush()  # nothing owed: no write
    assert LeaderEpochCache(tmp_path).entries == [E(2, 7), E(3, 8), E(4, 12)]


def test_a_flush_after_discard_writes_nothing(tmp_path: Path) -> None:
    """A deleted partition's owed rewrite must not recreate a file in its directory."""
    cache = LeaderEpochCache(tmp_path)
    cache.assign(0, 0)
    cache.truncate_from_end(0, durable=False)
    (tmp_path / LEADER_EPOCH_CHECKPOINT).unlink()
    cache.discard()
    cache.flush()
    assert list(tmp_path.iterdir()) == []


def test_a_flush_on_another_thread_never_writes_older_content_than_the_owner(tmp_path: Path) -> None:
    """The owner's durable changes and a flush thread's owed rewrite serialise on the cache's
    lock: whatever the interleaving, the file ends as the newest history."""
    for round_ in range(20):
        directory = tmp_path / str(round_)
        directory.mkdir()
        cache = LeaderEpochCache(directory)
        cache.assign(0, 0)
        cache.assign(1, 5)
        cache.truncate_from_end(5, durable=False)  # owed: [(0, 0)]
        flusher = threading.Thread(target=cache.flush)
        flusher.start()
        for epoch in range(2, 12):
            cache.assign(epoch, epoch * 10)
        flusher.join()
        assert not cache.unflushed
        assert (
            LeaderEpochCache(directory).entries
            == cache.entries
            == [
                E(0, 0),
                *(E(e, e * 10) for e in range(2, 12)),
            ]
        )


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (["0", "2", "0 0", "1 0"], [E(1, 0)]),  # an older file: the epoch that started there wins
        (["0", "2", "1 0", "0 4"], []),  # epochs going backwards: malformed, rebuilt by recovery
        (["0", "2", "0 4", "1 0"], []),
        (["0", "3", "0 0"], []),
        (["1", "1", "0 0"], []),
    ],
)
def test_checkpoint_files_read_by_the_rules(tmp_path: Path, lines: list[str], expected: list[E]) -> None:
    (tmp_path / LEADER_EPOCH_CHECKPOINT).write_text("\n".join(lines) + "\n")
    assert LeaderEpochCache(tmp_path).entries == expected
