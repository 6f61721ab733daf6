"""Size-prefixed frames, sans-IO (h11 style: bytes in, frames out).

Every Kafka request is an int32 size followed by that many bytes. The decoder accumulates bytes
from the socket and yields whole frames; the caller decides what to do with them. A frame larger
than ``socket.request.max.bytes`` (or a negative size) is a protocol violation after which Kafka
closes the connection, so the decoder raises and stays broken.

Invariant: frames are yielded in arrival order and each exactly once; no frame is yielded until
all of its bytes arrived.
"""

from __future__ import annotations

import struct

_SIZE = struct.Struct(">i")

DEFAULT_MAX_FRAME = 104_857_600  # socket.request.max.bytes


class FrameError(Exception):
    """The peer sent a size prefix we must not honour; the connection must be closed."""


class FrameDecoder:
    __slots__ = ("_buf", "_max", "_need")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME) -> None:
        self._buf = bytearray()
        self._max = max_frame_size
        self._need = -1  # size of the frame being accumulated, -1 while reading the prefix

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Add bytes; return every frame now complete (possibly none)."""
        self._buf += data
        frames: list[bytes] = []
        buf = self._buf
        pos = 0
        end = len(buf)
        while True:
            if self._need < 0:
                if end - pos < 4:
                    break
                size = _SIZE.unpack_from(buf, pos)[0]
                if size < 0 or size > self._max:
                    raise FrameError(f"frame size {size} outside [0, {self._max}] (socket.request.max.bytes)")
                self._need = size
                pos += 4
            if end - pos < self._need:
                break
            frames.append(bytes(buf[pos : pos + self._need]))
            pos += self._need
            self._need = -1
        if pos:
            del buf[:pos]
        return frames

    @property
    def buffered(self) -> int:
        return len(self._buf)


def frame(payload: bytes | bytearray) -> bytes:
    return _SIZE.pack(len(payload)) + payload
