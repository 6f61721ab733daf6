"""Replace a small file so that a crash or a power loss leaves the old or the new content.

The one way every metadata file of the broker is rewritten: checkpoints (recovery points, leader
epochs), ``meta.properties``, ``topics.json``, producer-state snapshots, the producer-id block
and the transaction coordinator's epoch. The steps, and why each is needed:

1. write the bytes to ``<name>.tmp`` (a crash here leaves the old file untouched; the stray
   ``*.tmp`` is garbage that readers ignore and loaders remove);
2. fsync the temporary file, so its data is on disk before any name points at it (without it a
   power loss after the rename can leave a complete-looking file full of zeros);
3. rename it over ``<name>`` (atomic on POSIX: a reader sees the old or the new file);
4. fsync the directory, so the rename itself is on disk. Without this step the new name lives
   only in the page cache: after a power loss the directory still points at the *old* file, and
   a value the broker already acted on (an epoch it handed out, a producer-id block it started
   to use) rolls back.

This is what Kafka's ``Utils.atomicMoveWithFallback`` plus ``Utils.flushDir`` do. ``durable=False``
skips both fsyncs (the rename stays atomic) for files whose loss only costs time.
"""

from __future__ import annotations

import os
from pathlib import Path

TEMP_SUFFIX = ".tmp"


def temp_path(path: Path) -> Path:
    """Where ``write_durably`` stages ``path``'s new content."""
    return path.with_name(path.name + TEMP_SUFFIX)


def fsync_directory(directory: Path) -> None:
    """Make the directory's entries (creations, renames, deletions) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> bool:
    """fsync ``path``'s data (opened read-only, as Kafka's ``Utils.flushFileIfExists``). False,
    without error, when the file no longer exists (deleted meanwhile: nothing left to make
    durable)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until all of ``data`` is written (a short write to a regular file is unusual,
    not impossible)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_durably(path: Path, data: bytes, *, durable: bool = True, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data``: temp file, fsync, rename, directory fsync. ``mode`` is
    the new file's permission bits (0o600 for secrets such as SCRAM keys)."""
    tmp = temp_path(path)
    tmp.unlink(missing_ok=True)  # a leftover would keep its old mode
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        write_all(fd, data)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if durable:
        fsync_directory(path.parent)


__all__ = ["TEMP_SUFFIX", "fsync_directory", "fsync_file", "temp_path", "write_durably"]
