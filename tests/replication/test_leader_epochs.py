"""Leader-epoch cache rules with Kafka's semantics (LeaderEpochFileCacheTest's cases)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactly.replication.leader_epochs import (
    UNDEFINED,
    EpochEndOffset,
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
