"""The cleaner's bounded map from key to the latest offset holding it (Kafka's SkimpyOffsetMap).

Theory of operation
-------------------
A cleaning pass first reads the dirty section and records, for each key, the offset of its newest
record; the recopy then keeps a keyed record only if its offset is that newest one. Keys are not
stored: each slot holds a 16-byte MD5 digest of a key and an 8-byte offset, 24 bytes, in one
``bytearray`` of ``log.cleaner.dedupe.buffer.size`` (divided between the cleaner threads) - as
Kafka's map, so the configured memory is the memory used. A collision between two keys' digests is
possible in principle and, as in Kafka, accepted (it would make the older of the two look
superseded).

The table is open-addressed with double hashing: the first slot and the step come from two
different parts of the digest, and the slot count is a prime, so a probe sequence visits every
slot. It is filled to at most ``log.cleaner.io.buffer.load.factor`` of its slots (``capacity``);
once full the pass stops there and the rest of the dirty section is cleaned by the next pass
(``is_full``). An all-zero digest marks an empty slot (MD5 giving sixteen zero bytes is accepted
as impossible, as in Kafka).

Invariants
----------
* ``latest_offset`` only grows within one build and is the last offset the map covers: every record
  at or below it that has a key was offered to the map (or belongs to aborted or control data).
* ``len(self) <= capacity <= slots``.

Memory
------
The table is one anonymous private ``mmap`` of ``slots * 24`` bytes, mapped once (the first
``clear``) and kept for the worker's life. The kernel gives its pages zero-filled on first touch,
so mapping it costs no CPU up front (a ``bytearray`` of the default 128 MB is 120-140 ms of CPU in
one C call -- a memset and 32,768 page faults -- that no duty-cycle tick can split), and ``clear``
empties it with ``madvise(MADV_DONTNEED)`` (the pages drop and read as zeros again) in
``CLEAR_CHUNK`` pieces with a ``tick`` between them: the worker's CPU duty cycle can stop it after
each piece instead of after a 20-50 ms stretch (measured for the whole 128 MB on this project's
box). Where ``madvise`` is missing the pieces are zeroed by copying instead.
"""

from __future__ import annotations

import hashlib
import mmap
import struct
from collections.abc import Callable

HASH_SIZE = 16  # MD5
BYTES_PER_ENTRY = HASH_SIZE + 8
_EMPTY = bytes(HASH_SIZE)
_OFFSET = struct.Struct(">q")
_HALVES = struct.Struct(">QQ")
#: Bytes emptied between two ticks by ``clear``: 4 MB is 1,024 pages (well under a millisecond).
CLEAR_CHUNK = 4 << 20


def _no_tick() -> None:
    pass


def _digest(key: bytes) -> bytes:
    return hashlib.md5(key, usedforsecurity=False).digest()


def _is_prime(n: int) -> bool:
    if n < 4:
        return n >= 2
    if n % 2 == 0:
        return False
    factor = 3
    while factor * factor <= n:
        if n % factor == 0:
            return False
        factor += 2
    return True


def _prime_at_most(n: int) -> int:
    while n > 2 and not _is_prime(n):
        n -= 1
    return max(n, 2)


class OffsetMap:
    """Key digest -> latest offset in a fixed ``bytearray`` (Kafka's SkimpyOffsetMap).

    Owns only its mapping. Lifecycle: one per worker, ``clear``-ed at the start of each pass (mapped
    by the first), ``close``-d to unmap it.
    """

    __slots__ = ("_buf", "_dirty", "_entries", "capacity", "latest_offset", "slots")

    def __init__(self, memory_bytes: int, load_factor: float = 0.9) -> None:
        if memory_bytes < 2 * BYTES_PER_ENTRY:
            raise ValueError(f"an offset map needs at least {2 * BYTES_PER_ENTRY} bytes, got {memory_bytes}")
        self.slots = _prime_at_most(memory_bytes // BYTES_PER_ENTRY)
        self.capacity = max(1, min(self.slots, int(self.slots * load_factor)))
        # Mapped by the first ``clear`` (the start of a pass): a broker whose logs never need
        # cleaning does not map the dedupe buffer (see *Memory*).
        self._buf: mmap.mmap | None = None
        self._dirty = False  # some slot may be non-zero
        self._entries = 0
        self.latest_offset = -1

    def clear(self, tick: Callable[[], None] = _no_tick) -> None:
        """Empty the map, calling ``tick`` between ``CLEAR_CHUNK`` pieces (see *Memory*)."""
        if self._buf is None:
            # Private: ``mmap``'s default for -1 is a shared mapping, whose pages MADV_DONTNEED
            # does not drop (their shmem backing keeps the data).
            flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
            self._buf = (
                mmap.mmap(-1, self.slots * BYTES_PER_ENTRY, flags=flags)
                if flags
                else mmap.mmap(-1, self.slots * BYTES_PER_ENTRY)
            )
        elif self._dirty:
            _zero(self._buf, tick)
        self._dirty = False
        self._entries = 0
        self.latest_offset = -1

    def close(self) -> None:
        """Unmap the table (a later use maps a new one)."""
        if self._buf is not None:
            self._buf.close()
            self._buf = None
        self._dirty = False
        self._entries = 0

    def __len__(self) -> int:
        return self._entries

    @property
    def is_full(self) -> bool:
        """No room for another distinct key (Kafka checks ``size < maxDesiredMapSize`` before each put)."""
        return self._entries >= self.capacity

    def _find(self, digest: bytes) -> int:
        """Byte position of ``digest``'s slot, or of the empty slot where it would go; -1 when the
        table is full and does not hold it."""
        if self._buf is None:
            self.clear()
        first, second = _HALVES.unpack(digest)
        slots = self.slots
        slot = int(first) % slots
        step = 1 + int(second) % (slots - 1)
        buf = self._buf
        assert buf is not None  # mapped above
        for _ in range(slots):
            pos = slot * BYTES_PER_ENTRY
            stored = buf[pos : pos + HASH_SIZE]
            if stored in (digest, _EMPTY):
                return pos
            slot = (slot + step) % slots
        return -1

    def put(self, key: bytes, offset: int) -> None:
        digest = _digest(key)
        pos = self._find(digest)
        if pos < 0:
            raise OverflowError("the offset map is full")
        assert self._buf is not None  # mapped by _find
        self._dirty = True
        if self._buf[pos : pos + HASH_SIZE] == _EMPTY:
            self._entries += 1
            self._buf[pos : pos + HASH_SIZE] = digest
        _OFFSET.pack_into(self._buf, pos + HASH_SIZE, offset)
        if offset > self.latest_offset:
            self.latest_offset = offset

    def get(self, key: bytes) -> int:
        """The latest offset of ``key``, or -1 when the map has not seen it."""
        digest = _digest(key)
        pos = self._find(digest)
        if pos < 0 or self._buf is None or self._buf[pos : pos + HASH_SIZE] != digest:
            return -1
        return int(_OFFSET.unpack_from(self._buf, pos + HASH_SIZE)[0])

    def update_latest_offset(self, offset: int) -> None:
        """Cover an offset that holds no key (a gap, aborted or control data, the end of a fully
        read segment)."""
        if offset > self.latest_offset:
            self.latest_offset = offset

    @property
    def utilization(self) -> float:
        return self._entries / self.slots


def _zero(buf: mmap.mmap, tick: Callable[[], None]) -> None:
    """Zero ``buf`` in ``CLEAR_CHUNK`` pieces, ``tick`` after each."""
    size = len(buf)
    dontneed = getattr(mmap, "MADV_DONTNEED", None)
    zeros = b"" if dontneed is not None else bytes(CLEAR_CHUNK)
    for start in range(0, size, CLEAR_CHUNK):
        length = min(CLEAR_CHUNK, size - start)
        if dontneed is not None:
            # Private anonymous mapping: the dropped pages read as zeros on the next touch.
            buf.madvise(dontneed, start, length)
        else:
            buf[start : start + length] = zeros[:length]
        tick()
