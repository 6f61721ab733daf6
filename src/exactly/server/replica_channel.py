"""The replica fetcher's connection to a leader: requests out, response frames in, no stream copies.

Why not asyncio streams: ``StreamReader.readexactly`` copies every received byte into the
stream's buffer and out again into a new ``bytes``, and a fetch response carries every
replicated byte. This is an ``asyncio.BufferedProtocol`` driven by the same sans-IO framer the
broker's own connections use (exactly.protocol.framing): the socket writes a large response's
body straight into a reusable bytearray, which the fetcher parses in place and appends to its
log from, then gives back with ``release`` so the next large response reuses the memory.

One request in flight at a time (the fetcher is strictly request/response), so responses are
matched by arrival; the caller still checks the correlation id.

Lifecycle: ``open`` connects (TLS when the inter-broker listener is SSL/SASL_SSL; the fetcher
then runs the SASL exchange through ``call``) -> ``call`` any number of times -> ``close``. A lost connection or
a frame the framer refuses makes the pending and every later ``call`` raise ConnectionError.
"""

from __future__ import annotations

import asyncio
import typing
from typing import Any

from exactly.protocol.framing import FrameError, Framer

MAX_RESPONSE = 128 * 1024 * 1024  # far above replica.fetch.response.max.bytes plus headers


class ReplicaChannel(asyncio.BufferedProtocol):
    """Owns the transport, the framer and the future of the response being waited for."""

    def __init__(self) -> None:
        self.framer = Framer(MAX_RESPONSE)
        self.transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._lost: Exception | None = None

    @classmethod
    async def open(cls, host: str, port: int, **options: Any) -> ReplicaChannel:
        """Connect; ``options`` go to ``create_connection`` (TLS: the inter-broker client's
        ``connect_options``; the framer sits above TLS exactly as above TCP)."""
        loop = asyncio.get_running_loop()
        _transport, channel = await loop.create_connection(cls, host, port, **options)
        return channel

    # ---- protocol callbacks ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = typing.cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = exc if exc is not None else ConnectionError("connection closed by the leader")
        self._wake()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.framer.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        try:
            self.framer.buffer_updated(nbytes)
        except FrameError as exc:
            self._lost = exc
            if self.transport is not None:
                self.transport.close()
        if self.framer.frames or self._lost is not None:
            self._wake()

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # ---- the caller's side -----------------------------------------------------------------
    async def call(self, request: bytes, timeout_s: float) -> bytearray:
        """Send one size-prefixed request and return the next response frame (without its size
        prefix). Give a large frame back with ``release`` once nothing references it.

        No response within ``timeout_s`` (``replica.socket.timeout.ms``) raises TimeoutError, an
        OSError: the caller drops the connection and reconnects, as Kafka's fetcher does for a
        request or response lost on the way (otherwise every partition of this leader would
        stall for good)."""
        frames = self.framer.frames
        if self._lost is not None:
            raise ConnectionError(f"connection to the leader lost: {self._lost!r}")
        assert self.transport is not None
        self.transport.write(request)
        while not frames:
            if self._lost is not None:
                raise ConnectionError(f"connection to the leader lost: {self._lost!r}")
            self._waiter = waiter = asyncio.get_running_loop().create_future()
            handle = waiter.get_loop().call_later(timeout_s, self._time_out, waiter)
            try:
                await self._waiter
            finally:
                handle.cancel()
                self._waiter = None
        return frames.popleft()

    @staticmethod
    def _time_out(waiter: asyncio.Future[None]) -> None:
        if not waiter.done():
            waiter.set_exception(TimeoutError("no response from the leader within replica.socket.timeout.ms"))

    def release(self, frame: bytearray) -> None:
        self.framer.release(frame)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
