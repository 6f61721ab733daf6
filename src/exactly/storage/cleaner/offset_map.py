"""The cleaner's bounded map from key to the latest offset holding it (Kafka's SkimpyOffsetMap).

Theory of operation
-------------------
A cleaning pass first reads the dirty section and records, for each key, the offset of its newest
record; the recopy then keeps a keyed record only if its offset is that newest one. Keys are not
stored: the map holds a 16-byte MD5 digest of each key (as Kafka does; a collision between two
keys is possible in principle and, as in Kafka, accepted: it would make the older of the two look
superseded). Kafka sizes the map by memory: ``log.cleaner.dedupe.buffer.size`` bytes shared by the
cleaner threads, 24 bytes a slot (digest + offset), filled to ``log.cleaner.io.buffer.load.factor``.
This map has the same *capacity in entries* (``slots * load_factor``); a Python dict spends more
than 24 bytes an entry, so the real memory is a small multiple of the configured size. What matters
for behaviour is kept: once the map holds ``capacity`` distinct keys the pass stops there and the
rest of the dirty section is cleaned by the next pass (``is_full``).

Invariants
----------
* ``latest_offset`` only grows within one build and is the last offset the map covers: every record
  at or below it that has a key was offered to the map (or belongs to aborted or control data).
* ``len(self) <= capacity``.
"""

from __future__ import annotations

import hashlib

HASH_SIZE = 16  # MD5
BYTES_PER_ENTRY = HASH_SIZE + 8


def _digest(key: bytes) -> bytes:
    return hashlib.md5(key, usedforsecurity=False).digest()


class OffsetMap:
    """Key digest -> latest offset, with Kafka's capacity for a given memory budget.

    Owns only its dict. Lifecycle: one per cleaner thread, ``clear``-ed at the start of each pass.
    """

    __slots__ = ("_entries", "capacity", "latest_offset", "slots")

    def __init__(self, memory_bytes: int, load_factor: float = 0.9) -> None:
        if memory_bytes < BYTES_PER_ENTRY:
            raise ValueError(f"an offset map needs at least {BYTES_PER_ENTRY} bytes, got {memory_bytes}")
        self.slots = memory_bytes // BYTES_PER_ENTRY
        self.capacity = max(1, int(self.slots * load_factor))
        self._entries: dict[bytes, int] = {}
        self.latest_offset = -1

    def clear(self) -> None:
        self._entries.clear()
        self.latest_offset = -1

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def is_full(self) -> bool:
        """No room for another distinct key (Kafka checks ``size < maxDesiredMapSize`` before each put)."""
        return len(self._entries) >= self.capacity

    def put(self, key: bytes, offset: int) -> None:
        self._entries[_digest(key)] = offset
        if offset > self.latest_offset:
            self.latest_offset = offset

    def get(self, key: bytes) -> int:
        """The latest offset of ``key``, or -1 when the map has not seen it."""
        return self._entries.get(_digest(key), -1)

    def update_latest_offset(self, offset: int) -> None:
        """Cover an offset that holds no key (a gap, aborted or control data, the end of a fully
        read segment)."""
        if offset > self.latest_offset:
            self.latest_offset = offset

    @property
    def utilization(self) -> float:
        return len(self._entries) / self.slots
