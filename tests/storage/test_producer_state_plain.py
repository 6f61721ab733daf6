"""``ProducerStateManager.prepare_plain`` (the Produce fast path's producer-state step) against
``prepare_append``: for every state and batch it stages the same entry or declines, and it
declines exactly when ``prepare_append`` answers a duplicate or raises."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from exactly.records.batch import BatchHeader
from exactly.storage.producer_state import (
    AppendOrigin,
    DuplicateBatch,
    ProducerStateError,
    ProducerStateManager,
)


def _header(pid: int, epoch: int, seq: int, count: int, base_offset: int, transactional: bool) -> BatchHeader:
    attributes = 0x10 if transactional else 0
    return BatchHeader(base_offset, 60, 0, 2, 0, attributes, count - 1, 5, 9, pid, epoch, seq, count)


@pytest.mark.parametrize("seed", range(20))
def test_prepare_plain_stages_what_prepare_append_stages_or_declines(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    state = ProducerStateManager(tmp_path)
    offset = 0
    accepted = declined = 0
    for step in range(400):
        pid = rng.choice((1, 2, 3))
        entry = state.last_entry(pid)
        epoch = entry.producer_epoch if entry is not None and rng.random() < 0.8 else rng.randint(-2, 3)
        last = entry.last_seq if entry is not None else -1
        seq = rng.choice((last + 1, last + 1, 0, last, last - 3, last + 5, 2**31 - 2))
        count = rng.choice((1, 2, 3))
        transactional = rng.random() < 0.05
        header = _header(pid, epoch, seq, count, offset, transactional)
        try:
            generic = state.prepare_append(header, origin=AppendOrigin.CLIENT, now_ms=step)
        except ProducerStateError:
            generic = None
        plain = None
        if not transactional:
            plain = state.prepare_plain(pid, epoch, seq, count - 1, offset, header.max_timestamp, step)
        if generic is None or isinstance(generic, DuplicateBatch):
            assert plain is None
        elif not transactional:
            assert plain == generic.updated
        if generic is not None and not isinstance(generic, DuplicateBatch):
            state.complete_append(generic)
            offset += count
            accepted += 1
        else:
            declined += 1
        if transactional and rng.random() < 0.5:  # end the transaction sometimes
            for producer, first in state.ongoing_transactions().items():
                cur = state.last_entry(producer)
                assert cur is not None and first is not None
                state._producers[producer] = type(cur)(
                    producer, cur.producer_epoch, cur.batches, cur.coordinator_epoch, step, None
                )
                state._ongoing.clear()
                state._first_unstable = None
    assert accepted > 50 and declined > 50
