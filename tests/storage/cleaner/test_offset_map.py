"""The bounded key -> offset map (Kafka's SkimpyOffsetMap tests)."""

from __future__ import annotations

import mmap

import pytest

from exactly.storage.cleaner.offset_map import BYTES_PER_ENTRY, CLEAR_CHUNK, OffsetMap


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


@pytest.mark.parametrize("madvise", [True, False], ids=["madvise", "copy"])
def test_clear_empties_a_multi_chunk_table_in_ticked_pieces_and_keeps_its_mapping(
    madvise: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``clear`` empties the table in ``CLEAR_CHUNK`` pieces with a tick after each (the worker's
    duty cycle may stop between them), by ``madvise`` or, where that is missing, by copying zeros,
    and reuses the one mapping (no new allocation per pass)."""
    if not madvise:
        monkeypatch.delattr(mmap, "MADV_DONTNEED", raising=False)
    m = OffsetMap(3 * CLEAR_CHUNK + 5 * BYTES_PER_ENTRY)
    keys = [b"key-%d" % i for i in range(2000)]
    for i, k in enumerate(keys):
        m.put(k, i)
    buf = m._buf
    ticks: list[int] = []
    m.clear(lambda: ticks.append(1))
    assert len(ticks) == -(-m.slots * BYTES_PER_ENTRY // CLEAR_CHUNK) >= 3
    assert m._buf is buf and len(m) == 0 and m.latest_offset == -1
    assert all(m.get(k) == -1 for k in keys)
    assert buf is not None and buf[:] == bytes(len(buf))  # every slot empty again, not just the counters
    for i, k in enumerate(keys[:100]):  # and it works as a fresh map
        m.put(k, 10 + i)
    assert len(m) == 100 and all(m.get(k) == 10 + i for i, k in enumerate(keys[:100]))
    ticks.clear()
    m.close()
    m.clear(lambda: ticks.append(1))  # a new mapping is already empty: nothing to tick over
    assert ticks == [] and len(m) == 0 and m.get(keys[0]) == -1


def test_clear_of_an_untouched_map_does_no_work() -> None:
    m = OffsetMap(3 * CLEAR_CHUNK)
    ticks: list[int] = []
    m.clear(lambda: ticks.append(1))
    m.clear(lambda: ticks.append(1))
    assert ticks == [] and m.get(b"k") == -1 and len(m) == 0
