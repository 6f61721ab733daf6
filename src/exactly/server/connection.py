"""One client connection: frames in, responses out, strictly in request order.

Kafka processes a connection's requests one at a time (the socket is muted until the response is
sent), so pipelined requests (librdkafka keeps up to 5 in flight) are read ahead but handled and
answered in order. A long-polling Fetch therefore delays later requests on the same connection,
exactly as in Kafka; clients use separate connections where that matters.

Receiving without copies: the connection is an ``asyncio.BufferedProtocol``. Small frames are
read into a reusable buffer and copied out once; a large frame (a produce request) gets a
bytearray of its exact size and the kernel writes its body straight into it. That bytearray is
the request: the produce path patches offsets inside it and writes it to the segment. Once the
request is answered and nothing references the bytearray any more, it goes to a small free-list
(FREE_BUFFERS buffers, FREE_BYTES in all) that later large frames take from, resized within
their allocation: no new zero-filled megabyte per produce request. A list rather than one spare
because librdkafka pipelines up to 5 produce requests, so the next frame usually starts arriving
before the previous one is answered.

Sending: each response costs a ``send()``, and on loopback that syscall also runs the client's
TCP input and wakes its thread. When small pipelined requests are already queued, their
responses are gathered and written with one ``writelines`` once the queue drains (or
PENDING_MAX_BYTES pile up). Order is unchanged, since responses are still produced one request
at a time. What is gathered is written out before a large frame is handled (a 1 MB produce
takes about a millisecond: holding an ack back that long stalls a client that keeps 5 requests
in flight, measured as -15% MB/s with confluent-kafka) and before any request that may wait
(only APIs in NEVER_WAIT are handled with responses held back), so a long-polling Fetch never
delays an answer that is already done.

What closes a connection (each with a log line, as Kafka does): a frame over
socket.request.max.bytes (or a negative size), an unparseable header, an unknown API key, a
non-ApiVersions request at a version we do not speak, a body the schema cannot parse. Everything
else gets an error code in a response. A failure inside a handler is logged and the connection
closed; the broker and its other connections are unaffected.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import struct
import sys
import time
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import VERSION_RANGES, ApiKey, ApiSchema, build, encode_response, schema
from exactly.protocol.framing import frame
from exactly.protocol.guard import overlong_array, without_unknown_tags
from exactly.protocol.header import (
    HeaderError,
    RequestHeader,
    parse_request_header,
    response_header,
    skip_tagged_fields,
)
from exactly.server.handlers import HANDLERS, PARSERS

if TYPE_CHECKING:
    from exactly.server.broker import Broker

log = logging.getLogger("exactly.connection")

SMALL_BUFFER = 256 * 1024
LARGE_FRAME = 64 * 1024  # frames at least this big are received into their own buffer
SPARE_MAX = 4 * 1024 * 1024  # largest answered frame buffer kept for reuse
FREE_BUFFERS = 5  # answered large-frame buffers kept (librdkafka's max.in.flight)
FREE_BYTES = 8 * 1024 * 1024  # and at most this many bytes of them
PENDING_MAX_BYTES = 4 * 1024 * 1024  # gathered response bytes that force a write
# APIs whose handlers never await (answered within the dispatch call): the only ones handled
# while earlier responses are held back for a combined write
NEVER_WAIT = frozenset({ApiKey.PRODUCE, ApiKey.LIST_OFFSETS, ApiKey.METADATA, ApiKey.API_VERSIONS})
MAX_QUEUED_FRAMES = 32  # read-ahead before we stop reading the socket
WRITE_HIGH_WATER = 8 * 1024 * 1024
_SIZE = struct.Struct(">i")


class CloseConnection(Exception):
    """Raised by the dispatcher when Kafka would close the connection."""


@dataclass(frozen=True, slots=True)
class RequestContext:
    header: RequestHeader
    api: ApiSchema
    peer: str

    @property
    def version(self) -> int:
        return self.header.api_version


class KafkaConnection(asyncio.BufferedProtocol):
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self._buf = bytearray(SMALL_BUFFER)
        self._start = 0
        self._end = 0
        self._large: bytearray | None = None
        self._large_filled = 0
        self._free: list[bytearray] = []  # answered large frames' buffers, free for reuse
        self._free_bytes = 0
        self._frames: collections.deque[bytearray] = collections.deque()
        self._wakeup: asyncio.Future[None] | None = None
        self._writable: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._paused_reading = False
        self._closing = False
        # connections.max.idle.ms: the loop time of the last bytes in or request answered, and
        # whether a request is being handled (a parked Fetch is not idle)
        self.last_active = time.monotonic()
        self.in_request = False

    # ---- protocol callbacks -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = typing.cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        self.broker.connections.add(self)
        self._task = asyncio.get_running_loop().create_task(self._process(), name=f"conn-{self.peer}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.broker.connections.discard(self)
        self._closing = True
        if self._task is not None and not self._task.done():
            self._task.cancel()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._large is not None:
            return memoryview(self._large)[self._large_filled :]
        if self._end == len(self._buf):
            self._compact()
        return memoryview(self._buf)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        self.last_active = time.monotonic()
        if self._large is not None:
            self._large_filled += nbytes
            if self._large_filled == len(self._large):
                self._push(self._large)
                self._large = None
            return
        self._end += nbytes
        self._split_frames()

    def pause_writing(self) -> None:
        if self._writable is None or self._writable.done():
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    # ---- framing ------------------------------------------------------------------------------
    def _compact(self) -> None:
        remaining = self._end - self._start
        if self._start:
            self._buf[0:remaining] = self._buf[self._start : self._end]
        self._start, self._end = 0, remaining

    def _split_frames(self) -> None:
        buf = self._buf
        max_size = self.broker.max_request_size
        while self._end - self._start >= 4:
            size = _SIZE.unpack_from(buf, self._start)[0]
            if size < 0 or size > max_size:
                self._close(f"frame size {size} outside [0, {max_size}] (socket.request.max.bytes)")
                return
            body = self._start + 4
            available = self._end - body
            if available >= size:
                self._push(buf[body : body + size])
                self._start = body + size
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
            buf.extend(bytes(size - n))
        return buf

    def _release(self, payload: bytearray) -> None:
        """Offer an answered frame's buffer to the free-list (the caller has checked that nothing
        else references it). When the list is full, a larger buffer replaces the smallest one:
        big produce frames are the ones worth keeping."""
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

    def _push(self, payload: bytearray) -> None:
        self._frames.append(payload)
        if len(self._frames) >= MAX_QUEUED_FRAMES and not self._paused_reading and self.transport is not None:
            self.transport.pause_reading()
            self._paused_reading = True
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    def _close(self, reason: str, level: int = logging.WARNING) -> None:
        if not self._closing:
            log.log(level, "closing connection from %s: %s", self.peer, reason)
        self._closing = True
        if self.transport is not None:
            self.transport.close()

    # ---- request processing -------------------------------------------------------------------
    async def _process(self) -> None:
        loop = asyncio.get_running_loop()
        broker = self.broker
        transport = self.transport
        assert transport is not None
        frames = self._frames
        pending: list[Any] = []  # responses held back for one combined write, in request order
        pending_bytes = 0
        try:
            while not self._closing:
                if not frames:
                    if pending:
                        transport.writelines(pending)
                        pending, pending_bytes = [], 0
                        if self._writable is not None and not self._writable.done():
                            await self._writable
                            continue
                    self._wakeup = loop.create_future()
                    await self._wakeup
                    continue
                payload = frames.popleft()
                if self._paused_reading and len(frames) < MAX_QUEUED_FRAMES // 2:
                    transport.resume_reading()
                    self._paused_reading = False
                if pending and _api_key(payload) not in NEVER_WAIT:
                    transport.writelines(pending)  # this request may park: send what is done
                    pending, pending_bytes = [], 0
                broker.metrics.bytes_in += len(payload) + 4
                self.in_request = True
                try:
                    chunks = await dispatch(broker, payload, self.peer)
                except CloseConnection as exc:
                    if pending and not self._closing:
                        transport.writelines(pending)  # answers owed to earlier requests
                    self._close(str(exc))
                    return
                self.in_request = False
                self.last_active = time.monotonic()
                # nothing but this frame's local holds the buffer (a memoryview into it would
                # count): reuse it for a later large frame
                if len(payload) >= LARGE_FRAME and sys.getrefcount(payload) == 2:
                    self._release(payload)
                if chunks is None or self._closing:
                    continue
                pending.extend(chunks)
                for c in chunks:
                    pending_bytes += len(c)
                if frames and pending_bytes < PENDING_MAX_BYTES and len(frames[0]) < LARGE_FRAME:
                    continue  # a small request is queued: answer it together with this one
                transport.writelines(pending)
                pending, pending_bytes = [], 0
                if self._writable is not None and not self._writable.done():
                    await self._writable
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("unexpected error on connection from %s; closing it", self.peer)
            self._close("internal error")

    def idle_for(self, now: float) -> float:
        """Seconds without a byte received or a request answered; 0 while a request is being
        handled or is queued (Kafka counts any channel activity; ours is request-granular)."""
        if self.in_request or self._frames or self._large is not None:
            return 0.0
        return now - self.last_active

    def close_idle(self, idle_s: float) -> None:
        """connections.max.idle.ms expired: close as Kafka's selector does (debug log only)."""
        self._close(f"idle for {idle_s * 1000:.0f} ms", logging.DEBUG)

    def abort(self) -> None:
        """Broker shutdown: drop the connection without waiting for in-flight work."""
        self._closing = True
        if self._task is not None:
            self._task.cancel()
        if self.transport is not None:
            self.transport.abort()


def _api_key(payload: bytearray) -> int:
    """The API key of a request frame (-1 when too short: dispatch closes the connection)."""
    return (payload[0] << 8 | payload[1]) if len(payload) >= 2 else -1


def _api_versions_unsupported(header: RequestHeader) -> list[bytes]:
    """Kafka answers an ApiVersions request of an unknown version with a v0 response carrying
    UNSUPPORTED_VERSION and the supported ranges, so the client can retry with one it knows."""
    api = schema(ApiKey.API_VERSIONS, 0)
    mod = api.response_module
    body = build(
        api.response_type,
        error_code=ErrorCode.unsupported_version,
        api_keys=tuple(
            build(mod.ApiVersion, api_key=k, min_version=lo, max_version=hi)
            for k, (lo, hi) in supported_apis()
        ),
    )
    return [frame(response_header(header.correlation_id, False) + encode_response(api, body))]


def supported_apis() -> list[tuple[int, tuple[int, int]]]:
    return [(int(k), VERSION_RANGES[k]) for k in sorted(HANDLERS) if k in VERSION_RANGES]


def _read_kio(api: Any, payload: bytearray, pos: int) -> Any:
    """Parse a request body with kio, skipping tagged fields its schema does not know (Kafka
    skips them; kio raises KeyError). kio's native reader refuses writable buffers, hence the
    copy; these are the small, rare requests."""
    try:
        request, _size = api.read_request(bytes(payload), pos)
    except KeyError:
        stripped = without_unknown_tags(api.request_type, payload, pos)
        if stripped is None:
            raise
        request, _size = api.read_request(stripped, 0)
    return request


async def dispatch(broker: Broker, payload: bytearray, peer: str) -> list[Any] | None:
    """Handle one request frame; returns the response as chunks for ``writelines`` (None: no
    response). Raises CloseConnection where Kafka closes the connection."""
    try:
        header, pos = parse_request_header(payload)
    except HeaderError as exc:
        raise CloseConnection(f"malformed request header: {exc}") from None
    key = header.api_key
    broker.metrics.requests[key] += 1
    handler = HANDLERS.get(key)
    if handler is None:
        raise CloseConnection(f"unknown or unsupported API key {key}")
    lo, hi = VERSION_RANGES[key]
    if not lo <= header.api_version <= hi:
        if key == ApiKey.API_VERSIONS:
            broker.metrics.error(key, ErrorCode.unsupported_version)
            return _api_versions_unsupported(header)
        raise CloseConnection(
            f"API {ApiKey(key).name} version {header.api_version} is not supported (supported {lo}-{hi})"
        )
    api = schema(key, header.api_version)
    try:
        if api.request_flexible:
            pos = skip_tagged_fields(payload, pos)
        parser = PARSERS.get(key)
        request: Any
        if parser is not None:
            request = parser(payload, pos, header.api_version)
        else:
            overlong = overlong_array(api.request_type, payload, pos)
            if overlong is not None:  # kio would reserve memory for it and abort the process
                raise ValueError(f"malformed request: {overlong}")
            request = _read_kio(api, payload, pos)
    except Exception as exc:  # any decode failure of client bytes
        raise CloseConnection(
            f"cannot parse {ApiKey(key).name} v{header.api_version} request: {type(exc).__name__}: {exc}"
        ) from None
    ctx = RequestContext(header, api, peer)
    response = await handler(broker, ctx, request)
    if response is None:  # acks=0 produce
        return None
    flexible = api.response_flexible and key != ApiKey.API_VERSIONS
    head = response_header(header.correlation_id, flexible)
    if isinstance(response, list):  # hand-encoded chunks (fetch)
        size = len(head) + sum(len(c) for c in response)
        broker.metrics.bytes_out += size + 4
        return [_SIZE.pack(size) + head, *response]
    body = response if isinstance(response, bytes | bytearray) else encode_response(api, response)
    broker.metrics.bytes_out += len(head) + len(body) + 4
    return [_SIZE.pack(len(head) + len(body)) + head, body]
