"""The replica fetcher's connection to a leader: requests out, response frames in, no stream copies.

Why not asyncio streams: ``StreamReader.readexactly`` copies every received byte into the
stream's buffer and out again into a new ``bytes``, and a fetch response carries every
replicated byte. This is an ``asyncio.BufferedProtocol`` driven by the same sans-IO framer the
broker's own connections use (exactly.protocol.framing): the socket writes a large response's
body straight into a reusable bytearray, which the fetcher parses in place and appends to its
log from, then gives back with ``release`` so the next large response reuses the memory.

One request in flight at a time (the fetcher is strictly request/response), so responses are
matched by arrival; the caller still checks the correlation id.

Frames handled in the protocol callback (``call``'s ``on_frame``): in steady state a follower
fetches back to back, and waking the fetcher task for every response costs a future, a timer and
a coroutine resumption per round trip plus one event-loop turn of latency before the follower
appends and sends its next Fetch (the leader's acks=all answer waits on that Fetch). So while a
``call`` waits, each complete frame is first offered to ``on_frame`` right in ``buffer_updated``:
it either declines (``False``: nothing was changed, the caller gets the frame as before), takes it
and hands back the next request (bytes: written at once, the same ``call`` goes on waiting), or
takes it and gives control back to the caller (``True``: ``call`` returns None). An exception it
raises is raised by ``call``. The response timeout runs from the last request written, with one
timer per ``call`` that re-arms itself when a later request was sent (not one per request).

Lifecycle: ``open`` connects (TLS when the inter-broker listener is SSL/SASL_SSL; the fetcher
then runs the SASL exchange through ``call``) -> ``call`` any number of times -> ``close``. A lost connection or
a frame the framer refuses makes the pending and every later ``call`` raise ConnectionError.
"""

from __future__ import annotations

import asyncio
import typing
from collections.abc import Callable
from typing import Any

from exactly.protocol.framing import FrameError, Framer

MAX_RESPONSE = 128 * 1024 * 1024  # far above replica.fetch.response.max.bytes plus headers

# A frame handler: False = declined (untouched), True = taken (``call`` returns None), bytes = taken
# and this is the next request (``call`` sends it and goes on waiting).
OnFrame = Callable[[bytearray], bytes | bytearray | bool]


class ReplicaChannel(asyncio.BufferedProtocol):
    """Owns the transport, the framer and the future of the response being waited for."""

    def __init__(self) -> None:
        self.framer = Framer(MAX_RESPONSE)
        self.transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._lost: Exception | None = None
        self._on_frame: OnFrame | None = None  # set while a ``call`` with a handler waits
        self._handled = False  # the handler took a frame and gave control back (``True``)
        self._error: BaseException | None = None  # what the handler raised
        self._sent_at = 0.0  # loop time the request in flight was written
        self._timeout_s = 0.0
        self._timer: asyncio.TimerHandle | None = None  # the waiting ``call``'s response timeout

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
        frames = self.framer.frames
        if frames and self._on_frame is not None and self._lost is None:
            waiter = self._waiter
            if waiter is not None and not waiter.done():  # not while cancelled (stop())
                self._offer(frames)
        if frames or self._lost is not None or self._handled or self._error is not None:
            self._wake()

    def _offer(self, frames: typing.Any) -> None:
        """Hand complete frames to ``on_frame`` (see the module docstring), in arrival order."""
        on_frame = self._on_frame
        transport = self.transport
        while frames and on_frame is not None and transport is not None:
            frame = frames[0]
            try:
                outcome = on_frame(frame)
            except Exception as exc:  # raised by ``call`` in the fetcher's task
                self._error = exc
                self._on_frame = None
                # the stream's state is unknown now: no later call may take a stale frame
                self._lost = ConnectionError(f"frame handler failed: {exc!r}")
                return
            if outcome is False:
                return  # declined: the caller takes it
            frames.popleft()
            self.framer.release(frame)
            if outcome is True:
                self._handled = True
                self._on_frame = None
                return
            transport.write(outcome)
            self._sent_at = asyncio.get_running_loop().time()

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # ---- the caller's side -----------------------------------------------------------------
    async def call(
        self, request: bytes | bytearray, timeout_s: float, on_frame: OnFrame | None = None
    ) -> bytearray | None:
        """Send one size-prefixed request and return the next response frame (without its size
        prefix). Give a large frame back with ``release`` once nothing references it. With
        ``on_frame``, responses are first offered to it (module docstring): None once it took
        one and gave control back.

        No response within ``timeout_s`` (``replica.socket.timeout.ms``) raises TimeoutError, an
        OSError: the caller drops the connection and reconnects, as Kafka's fetcher does for a
        request or response lost on the way (otherwise every partition of this leader would
        stall for good)."""
        frames = self.framer.frames
        if self._lost is not None:
            raise ConnectionError(f"connection to the leader lost: {self._lost!r}")
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        self.transport.write(request)
        self._sent_at = loop.time()
        self._timeout_s = timeout_s
        if frames:
            return frames.popleft()
        self._on_frame, self._handled, self._error = on_frame, False, None
        self._timer = loop.call_later(timeout_s, self._time_out)
        try:
            while True:
                if self._error is not None:
                    raise self._error
                if self._handled:
                    return None
                if frames:
                    return frames.popleft()
                if self._lost is not None:
                    raise ConnectionError(f"connection to the leader lost: {self._lost!r}")
                self._waiter = waiter = loop.create_future()
                try:
                    await waiter
                finally:
                    self._waiter = None
        finally:
            self._on_frame = None
            self._handled = False
            self._error = None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def _time_out(self) -> None:
        """The response timeout, from the last request written: a later request (sent by the
        frame handler) re-arms it for what is left of its own."""
        loop = asyncio.get_running_loop()
        left = self._sent_at + self._timeout_s - loop.time()
        if left > 0:
            self._timer = loop.call_later(left, self._time_out)
            return
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(TimeoutError("no response from the leader within replica.socket.timeout.ms"))

    def release(self, frame: bytearray) -> None:
        self.framer.release(frame)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
