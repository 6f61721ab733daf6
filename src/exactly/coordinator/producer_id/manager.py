"""Producer id allocation that never reuses an id, across restarts (Kafka's ProducerIdManager).

Why
---
A producer id names a producer's sequence space on every partition. If a restarted broker handed
out an id again, the new producer would inherit the old one's cached sequences: its first batches
would be rejected as out of order, or, worse, acknowledged as duplicates and silently dropped.

How
---
Ids are handed out from blocks of ``BLOCK_SIZE`` (1000, as Kafka). Before the first id of a block
is returned, the end of the block is persisted (storage/durable.py: tmp + fsync + rename + dir fsync), so
the file always holds an upper bound of every id ever handed out. A restart starts a fresh block
at that bound: the unused rest of the previous block is skipped, never reused.

Kafka's brokers fetch the next block from the controller when 90% of the current one is used,
because that is a network round trip. Here reserving a block is one local file write every 1000
ids, so it happens synchronously when the current block is exhausted.

File layout (big-endian, 14 bytes): version int16 = 1, next block start int64, CRC32C (uint32)
of the first 10 bytes. An unreadable file is an error, never "start from 0": guessing could reuse
ids.

Invariants: single-threaded use (the event loop); every id returned is < the persisted bound;
ids are increasing and >= 0.
"""

from __future__ import annotations

import struct
from pathlib import Path

import crc32c

from exactly.storage.durable import write_durably
from exactly.types import ProducerId

BLOCK_SIZE = 1000
FILE_VERSION = 1
MAX_PRODUCER_ID = 2**63 - 1

_BODY = struct.Struct(">hq")
_CRC = struct.Struct(">I")


class ProducerIdStateError(Exception):
    """The persisted block reservation is unreadable or the id space is exhausted."""


class ProducerIdManager:
    """Hands out producer ids from persisted blocks of ``block_size``.

    Owns the reservation file at ``path`` and the current block (next id, persisted bound).
    Lifecycle: opening reads the bound (or starts at 0 without a file); every block is persisted
    before its first id is handed out; nothing to close.
    """

    def __init__(self, path: Path, *, block_size: int = BLOCK_SIZE) -> None:
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        self.path = path
        self.block_size = block_size
        self._reserved_end = _read_reserved_end(path)  # first id not yet reserved
        self._next = self._reserved_end  # empty current block: reserve on first use

    @property
    def reserved_end(self) -> int:
        """The persisted bound: every id handed out so far is below it."""
        return self._reserved_end

    def generate(self) -> ProducerId:
        if self._next >= self._reserved_end:
            self._reserve_block()
        pid = self._next
        self._next += 1
        return ProducerId(pid)

    def _reserve_block(self) -> None:
        start = self._reserved_end
        end = start + self.block_size
        if end > MAX_PRODUCER_ID:
            raise ProducerIdStateError("producer id space exhausted")
        _write_reserved_end(self.path, end)
        self._next = start
        self._reserved_end = end


def _read_reserved_end(path: Path) -> int:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    if len(data) != _BODY.size + _CRC.size:
        raise ProducerIdStateError(f"{path}: {len(data)} bytes, expected {_BODY.size + _CRC.size}")
    (crc,) = _CRC.unpack_from(data, _BODY.size)
    if crc32c.crc32c(data[: _BODY.size]) != crc:
        raise ProducerIdStateError(f"{path}: CRC32C mismatch")
    version, reserved_end = _BODY.unpack_from(data, 0)
    if version != FILE_VERSION or reserved_end < 0:
        raise ProducerIdStateError(f"{path}: unsupported version {version} or bound {reserved_end}")
    return int(reserved_end)


def _write_reserved_end(path: Path, reserved_end: int) -> None:
    body = _BODY.pack(FILE_VERSION, reserved_end)
    data = body + _CRC.pack(crc32c.crc32c(body))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_durably(path, data)
