"""write_whole: all of the bytes at a position, or the file cut back to it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from exactly.storage import file_write
from exactly.storage.file_write import write_whole


def _fd(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)


def test_writes_at_the_position(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"0123456789")
    fd = _fd(path)
    try:
        write_whole(fd, memoryview(bytearray(b"abcdef"))[1:4], 10)
        write_whole(fd, b"XY", 2)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"01XY456789bcd"


def test_short_writes_are_continued(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.pwrite

    def three_at_a_time(fd: int, data: bytes | memoryview, position: int) -> int:
        return real(fd, bytes(data)[:3], position)

    monkeypatch.setattr(file_write.os, "pwrite", three_at_a_time)
    path = tmp_path / "f"
    fd = _fd(path)
    try:
        write_whole(fd, b"abcdefghij", 0)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"abcdefghij"


def test_a_failed_write_leaves_the_file_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.pwrite
    calls = []

    def fails_after_a_part(fd: int, data: bytes | memoryview, position: int) -> int:
        calls.append(position)
        if len(calls) > 1:
            raise OSError(28, "No space left on device")
        return real(fd, bytes(data)[:4], position)

    monkeypatch.setattr(file_write.os, "pwrite", fails_after_a_part)
    path = tmp_path / "f"
    path.write_bytes(b"head")
    fd = _fd(path)
    try:
        with pytest.raises(OSError, match="No space"):
            write_whole(fd, b"a torn batch", 4)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"head"


def test_preallocate_reserves_blocks_past_the_end_without_changing_the_size(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 4096)
    fd = _fd(path)
    try:
        if not file_write.preallocate(fd, 4096, 1 << 20):
            pytest.skip("this file system has no fallocate(FALLOC_FL_KEEP_SIZE)")
        st = os.fstat(fd)
        assert st.st_size == 4096 and st.st_blocks * 512 >= 4096 + (1 << 20)
        os.ftruncate(fd, 4096)  # the same size: the reserved blocks are freed
        assert os.fstat(fd).st_blocks * 512 < 1 << 20
    finally:
        os.close(fd)
    assert path.read_bytes() == b"x" * 4096


def test_preallocate_says_no_rather_than_raising(tmp_path: Path) -> None:
    fd = os.open("/dev/null", os.O_RDWR)
    try:
        assert file_write.preallocate(fd, 0, 4096) is False
    finally:
        os.close(fd)


def test_a_file_opened_again_frees_blocks_a_dead_process_left_reserved(tmp_path: Path) -> None:
    """Blocks reserved past the end by a process that died before freeing them are counted as
    reserved by the reserve of the file opened again (``BlockReserve.of_existing``), so its
    release frees them; a file without such blocks has nothing to free."""
    path = tmp_path / "f"
    path.write_bytes(b"x" * 4096)
    fd = _fd(path)
    try:
        if not file_write.preallocate(fd, 4096, 4 << 20):
            pytest.skip("this file system has no fallocate(FALLOC_FL_KEEP_SIZE)")
    finally:
        os.close(fd)  # no release: what kill -9 leaves
    fd = _fd(path)
    try:
        reserve = file_write.BlockReserve.of_existing(os.fstat(fd))
        assert os.fstat(fd).st_blocks * 512 >= 4 << 20
        reserve.release(fd, 4096)
        st = os.fstat(fd)
        assert st.st_size == 4096 and st.st_blocks * 512 < 1 << 20
        again = file_write.BlockReserve.of_existing(st)
        assert again._upto == 0  # nothing past the end any more
    finally:
        os.close(fd)
    assert path.read_bytes() == b"x" * 4096
