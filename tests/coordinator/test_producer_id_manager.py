"""ProducerIdManager: block reservation persisted before use, no id reused across restarts."""

from __future__ import annotations

from pathlib import Path

import pytest

from exactly.coordinator.producer_id import manager as manager_module
from exactly.coordinator.producer_id.manager import (
    BLOCK_SIZE,
    ProducerIdManager,
    ProducerIdStateError,
)


def test_ids_are_sequential_from_zero_and_block_is_persisted_first(tmp_path: Path) -> None:
    path = tmp_path / "producer_id_block"
    mgr = ProducerIdManager(path)
    assert not path.exists()
    assert [mgr.generate() for _ in range(3)] == [0, 1, 2]
    assert BLOCK_SIZE == 1000
    assert mgr.reserved_end == 1000
    assert ProducerIdManager(path).reserved_end == 1000  # on disk, not only in memory


def test_restart_never_reuses_an_id(tmp_path: Path) -> None:
    path = tmp_path / "pid"
    seen: set[int] = set()
    for _restart in range(4):
        mgr = ProducerIdManager(path, block_size=10)
        for _ in range(13):  # crosses a block boundary every other restart
            pid = mgr.generate()
            assert pid not in seen
            seen.add(pid)
    assert max(seen) < ProducerIdManager(path, block_size=10).reserved_end
    # restart skips the rest of the reserved block
    assert ProducerIdManager(path, block_size=10).generate() == 80


def test_next_block_reserved_when_exhausted(tmp_path: Path) -> None:
    path = tmp_path / "pid"
    mgr = ProducerIdManager(path)
    ids = [mgr.generate() for _ in range(1001)]
    assert ids == list(range(1001))
    assert ProducerIdManager(path).reserved_end == 2000


def test_no_id_handed_out_if_reservation_cannot_be_persisted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "pid"
    mgr = ProducerIdManager(path, block_size=2)
    assert [mgr.generate(), mgr.generate()] == [0, 1]

    def fail(_path: Path, _end: int) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(manager_module, "_write_reserved_end", fail)
    with pytest.raises(OSError):
        mgr.generate()
    monkeypatch.undo()
    assert mgr.generate() == 2  # the failed block was never used
    assert ProducerIdManager(path, block_size=2).generate() == 4


def test_write_is_atomic_and_leaves_no_temp_file(tmp_path: Path) -> None:
    ProducerIdManager(tmp_path / "pid").generate()
    assert [p.name for p in tmp_path.iterdir()] == ["pid"]


@pytest.mark.parametrize("content", [b"", b"\x00" * 13, b"\x00" * 14, b"garbage-garbage"])
def test_corrupt_file_is_an_error_not_a_fresh_start(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "pid"
    path.write_bytes(content)
    with pytest.raises(ProducerIdStateError):
        ProducerIdManager(path)


def test_bit_flip_detected(tmp_path: Path) -> None:
    path = tmp_path / "pid"
    ProducerIdManager(path).generate()
    raw = bytearray(path.read_bytes())
    raw[5] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(ProducerIdStateError):
        ProducerIdManager(path)
