"""The bounded key -> offset map (Kafka's SkimpyOffsetMap tests)."""

from __future__ import annotations

import pytest

from exactly.storage.cleaner.offset_map import BYTES_PER_ENTRY, OffsetMap


def test_put_get_and_overwrite() -> None:
    m = OffsetMap(1000 * BYTES_PER_ENTRY)
    for i in range(500):
        m.put(b"key-%d" % i, i)
    assert len(m) == 500 and m.latest_offset == 499
    assert all(m.get(b"key-%d" % i) == i for i in range(500))
    assert m.get(b"absent") == -1
    m.put(b"key-7", 900)
    assert len(m) == 500 and m.get(b"key-7") == 900 and m.latest_offset == 900
    m.clear()
    assert len(m) == 0 and m.get(b"key-7") == -1 and m.latest_offset == -1


def test_capacity_is_the_memory_budget_at_the_load_factor() -> None:
    m = OffsetMap(100 * BYTES_PER_ENTRY, load_factor=0.9)
    assert m.slots <= 100 and m.capacity == int(m.slots * 0.9)
    i = 0
    while not m.is_full:
        m.put(b"k%d" % i, i)
        i += 1
    assert len(m) == m.capacity
    assert all(m.get(b"k%d" % j) == j for j in range(i))


def test_a_completely_full_table_still_answers() -> None:
    m = OffsetMap(13 * BYTES_PER_ENTRY, load_factor=1.0)
    for i in range(m.slots):
        m.put(b"k%d" % i, i)
    assert m.is_full and m.get(b"not there") == -1
    with pytest.raises(OverflowError):
        m.put(b"one too many", 1)
    m.update_latest_offset(5)
    assert m.latest_offset == m.slots - 1
