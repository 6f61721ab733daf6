"""Size-prefixed request frames, sans-IO and without copies: the one framer the broker runs.

Every Kafka request is an int32 size followed by that many bytes. ``Framer`` is driven the way
``asyncio.BufferedProtocol`` drives a protocol: ``get_buffer()`` hands out writable memory that
the socket reads into, ``buffer_updated(n)`` says how much arrived, and whole frames appear, in
arrival order, on ``frames`` as writable bytearrays (the produce path patches offsets inside its
frame and writes that very bytearray to the segment). It does no I/O and knows nothing of
asyncio; the connection (exactly.server.connection) owns the socket, flow control and wake-ups,
and the unit tests and the fuzzer drive this class exactly as the connection does.

Small frames are read into one reusable buffer (SMALL_BUFFER) and copied out once. A large frame
(LARGE_FRAME and up, or one that cannot fit the small buffer) gets a bytearray of its exact size
and the socket writes its body straight into it; only what arrived before its size was known is
copied over from the small buffer. So that this is a few KB and not a whole small buffer, the
read right after a large frame (a producer's next request is usually large too) is offered only
HEAD_READ bytes: one more ``recv`` per large frame instead of a copy of up to SMALL_BUFFER bytes
(profiled at 100 B-record produce: that copy was ~5% of the broker's CPU; a 4 KB read costs a few
µs). Once a large frame is answered and nothing references it any more, the connection hands it
back with ``release``: it goes to a small free-list (FREE_BUFFERS buffers, FREE_BYTES in all)
that later large frames take from, resized within their allocation, so no new zero-filled
megabyte per produce request. A list rather than one spare because librdkafka pipelines up to 5
produce requests, so the next frame usually starts arriving before the previous one is answered.

A size over ``socket.request.max.bytes`` or below zero is a protocol violation after which Kafka
closes the connection: ``buffer_updated`` raises FrameError, and the framer stays broken.

Invariants: each frame appears on ``frames`` exactly once, only after all of its bytes arrived,
in arrival order; a frame on ``frames`` shares no memory with a buffer the framer still writes to.
"""

from __future__ import annotations

import collections
import struct

SMALL_BUFFER = 256 * 1024
LARGE_FRAME = 64 * 1024  # frames at least this big are received into their own buffer
HEAD_READ = 4096  # the read offered right after a large frame (see the module docstring)
SPARE_MAX = 4 * 1024 * 1024  # largest answered frame buffer kept for reuse
FREE_BUFFERS = 5  # answered large-frame buffers kept (librdkafka's max.in.flight)
FREE_BYTES = 8 * 1024 * 1024  # and at most this many bytes of them
DEFAULT_MAX_FRAME = 104_857_600  # socket.request.max.bytes

_SIZE = struct.Struct(">i")
# read-only zeros a free-list buffer grows by (at most SPARE_MAX bytes: a buffer never grows past
# 1/8 of its length, and none longer than SPARE_MAX is kept); calloc'ed, so its pages are the
# kernel's shared zero page until read, and reading them allocates nothing
_ZEROS = memoryview(bytes(SPARE_MAX))


class FrameError(Exception):
    """The peer sent a size prefix we must not honour; the connection must be closed."""


class Framer:
    """Splits a byte stream into request frames.

    Owns the small read buffer (``_buf``, bytes ``_start:_end`` not yet framed), the large frame
    being received (``_large``, ``_large_filled`` bytes of it so far), the free-list of answered
    large-frame buffers, and ``frames``, the queue of whole frames the consumer pops from the
    left. Lives as long as its connection; after a FrameError it refuses further bytes."""

    __slots__ = (
        "_buf",
        "_end",
        "_free",
        "_free_bytes",
        "_head_read",
        "_large",
        "_large_filled",
        "_max",
        "_start",
        "broken",
        "frames",
    )

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME) -> None:
        self._max = max_frame_size
        self._buf = bytearray(SMALL_BUFFER)
        self._start = 0
        self._end = 0
        self._large: bytearray | None = None
        self._large_filled = 0
        self._free: list[bytearray] = []  # answered large frames' buffers, free for reuse
        self._free_bytes = 0
        self._head_read = False  # the last frame was large: offer only HEAD_READ bytes next
        self.frames: collections.deque[bytearray] = collections.deque()
        self.broken = False

    def set_max_frame_size(self, max_frame_size: int) -> None:
        """Change the limit for frames not split yet (a SASL listener keeps it at
        sasl.server.max.receive.size until the client has authenticated)."""
        self._max = max_frame_size

    @property
    def receiving_large(self) -> bool:
        """A large frame is partly received (the connection counts that as activity)."""
        return self._large is not None

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Where the next bytes go: the rest of the large frame, else the small buffer's tail
        (HEAD_READ bytes of it after a large frame, until a size prefix has been read)."""
        if self._large is not None:
            return memoryview(self._large)[self._large_filled :]
        if self._end == len(self._buf):
            self._compact()
        if self._head_read and self._end - self._start < 4:
            return memoryview(self._buf)[self._end : self._end + HEAD_READ]
        return memoryview(self._buf)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        """``nbytes`` were written at the start of the last ``get_buffer``: append every frame
        now whole to ``frames``. Raises FrameError on a size Kafka refuses."""
        if self.broken:
            raise FrameError("connection already failed framing")
        if self._large is not None:
            self._large_filled += nbytes
            if self._large_filled == len(self._large):
                self.frames.append(self._large)
                self._large = None
                self._head_read = True
            return
        self._end += nbytes
        self._split()

    def _compact(self) -> None:
        remaining = self._end - self._start
        if self._start:
            self._buf[0:remaining] = self._buf[self._start : self._end]
        self._start, self._end = 0, remaining

    def _split(self) -> None:
        buf = self._buf
        max_size = self._max
        frames = self.frames
        while self._end - self._start >= 4:
            size = _SIZE.unpack_from(buf, self._start)[0]
            if size < 0 or size > max_size:
                self.broken = True
                raise FrameError(f"frame size {size} outside [0, {max_size}] (socket.request.max.bytes)")
            body = self._start + 4
            available = self._end - body
            if available >= size:
                frames.append(buf[body : body + size])
                self._start = body + size
                self._head_read = size >= LARGE_FRAME
                continue
            if size >= LARGE_FRAME or size + 4 > len(buf):
                large = self._large_buffer(size)
                large[:available] = memoryview(buf)[body : self._end]
                self._large, self._large_filled = large, available
                self._start = self._end = 0
                return
            break
        if self._start == self._end:
            self._start = self._end = 0
        elif self._start > len(buf) // 2:
            self._compact()

    def _large_buffer(self, size: int) -> bytearray:
        """A bytearray of exactly ``size`` bytes for a large frame. A free buffer whose allocation
        holds ``size`` at least half full is resized in place (CPython moves neither shrinking
        nor growing within the allocation; the tightest such buffer is taken); else the largest
        one grows when that stays within CPython's 1/8 over-allocation; else a new bytearray,
        which costs a zero fill of ``size`` and, from fresh memory, a page fault per 4 KB."""
        free = self._free
        fit = grow = -1  # tightest buffer holding size; largest one short of it
        for i, buf in enumerate(free):
            cap = buf.__alloc__() - 1
            if cap >= size:
                if size >= cap // 2 and (fit < 0 or cap < free[fit].__alloc__() - 1):
                    fit = i
            elif grow < 0 or cap > free[grow].__alloc__() - 1:
                grow = i
        if fit < 0 and grow >= 0 and size - len(free[grow]) <= len(free[grow]) // 8:
            fit = grow
        if fit < 0:
            return bytearray(size)
        buf = free.pop(fit)
        self._free_bytes -= buf.__alloc__()
        n = len(buf)
        if n >= size:
            del buf[size:]
        else:
            # grown from a view of zeros: no temporary ``bytes(size - n)`` allocated, zero-filled
            # and freed per growth (a copy of the zeros only, which the socket overwrites)
            buf += _ZEROS[: size - n]
        return buf

    def release(self, payload: bytearray) -> None:
        """Offer an answered frame's buffer to the free-list. The caller guarantees nothing else
        references it (a memoryview into it would see the next frame's bytes). When the list is
        full, a larger buffer replaces the smallest one: big produce frames are worth keeping."""
        if len(payload) < LARGE_FRAME or len(payload) > SPARE_MAX:
            return
        free = self._free
        n = payload.__alloc__()
        while free and (len(free) >= FREE_BUFFERS or self._free_bytes + n > FREE_BYTES):
            smallest = min(range(len(free)), key=lambda i: free[i].__alloc__())
            if free[smallest].__alloc__() >= n:
                return
            self._free_bytes -= free.pop(smallest).__alloc__()
        if self._free_bytes + n <= FREE_BYTES:
            free.append(payload)
            self._free_bytes += n


def frame(payload: bytes | bytearray) -> bytes:
    """``payload`` with its size prefix (a response the dispatcher builds in one piece)."""
    return _SIZE.pack(len(payload)) + payload
