"""One client connection: frames in, responses out, strictly in request order.

Kafka processes a connection's requests one at a time (the socket is muted until the response is
sent), so pipelined requests (librdkafka keeps up to 5 in flight) are read ahead but handled and
answered in order. A long-polling Fetch therefore delays later requests on the same connection,
exactly as in Kafka; clients use separate connections where that matters.

One deliberate difference: a cluster's acks=all Produce that has appended and now only waits for
the ISR comes back from dispatch as a ``Deferred`` answer, and the next queued Produce is handled
meanwhile (up to MAX_DEFERRED waiting); any other request waits until the deferred answers are
written. Answers still go out in request order. Kafka mutes the connection until the answer is
sent, which at 1,000 acks=all produces/s queued each behind the previous one's replication round
trip (about 1 ms here, so p50 4.5 ms with librdkafka's 5 in flight); the appends still happen one
request at a time in arrival order, see ``handlers.produce``.

A lone frame that a fast path takes whole (the common single-broker Produce and consumer Fetch,
``dispatch.fast_answer``) is answered from the read callback itself when the request task sits
idle with nothing held back or deferred: no future, no task step per request. A parked consumer
Fetch of the fast path (``ExclusiveAnswer``) holds back every later request, as an awaited one.

Receiving goes through the sans-IO framer (exactly.protocol.framing): this class is an
``asyncio.BufferedProtocol`` whose ``get_buffer``/``buffer_updated`` hand the socket's bytes to
it, so the kernel writes a large frame's body straight into the bytearray that becomes the
request. Each request goes to the dispatcher (exactly.server.dispatch); once it is answered and
nothing references a large frame's buffer any more, the buffer goes back to the framer's
free-list for a later large frame.

Sending: each response costs a ``send()``, and on loopback that syscall also runs the client's
TCP input and wakes its thread. When small pipelined requests are already queued, their
responses are gathered and written with one ``writelines`` once the queue drains (or
PENDING_MAX_BYTES pile up). Order is unchanged, since responses are still produced one request
at a time. What is gathered is written out before a large frame is handled (a 1 MB produce
takes about a millisecond: holding an ack back that long stalls a client that keeps 5 requests
in flight, measured as -15% MB/s with confluent-kafka) and before any request that may wait
(only APIs in NEVER_WAIT are handled with responses held back; a cluster's acks=all Produce that
must wait for the ISR writes them out through ``RequestContext.before_park`` just before it
parks), so a long-polling Fetch or a parked produce never delays an answer that is already done.

Security (exactly.security): the connection belongs to one listener. On a TLS listener the
transport is TLS (the handshake is done before ``connection_made``), the principal is the
client certificate's mapped name (or ``User:ANONYMOUS`` without one), and Fetch answers are
copied rather than sent with sendfile (the kernel cannot encrypt them) and handed to the
transport in pieces, so that the client decrypts while the broker encrypts
(exactly.server.tls_write). On a SASL listener
every frame goes to the connection's ``SaslAuthenticator`` until it is authenticated: only
ApiVersions reaches the dispatcher before then, frames are limited to
sasl.server.max.receive.size, and a failed authentication answers (when the framing allows),
stops reading and closes after connection.failed.authentication.delay.ms. Each outcome is
counted and written as an audit line (never a password or token).

What closes a connection (each with a log line, as Kafka does): a frame over
socket.request.max.bytes or with a negative size (the framer), and whatever the dispatcher
raises CloseConnection for (see there). A failure inside a handler is logged and the connection
closed; the broker and its other connections are unaffected.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
import typing
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any

from exactly.protocol.apis import ApiKey
from exactly.protocol.framing import LARGE_FRAME, FrameError, Framer
from exactly.security.listener_security import ListenerSecurity
from exactly.security.listeners import ListenerSpec, SecurityProtocol
from exactly.security.principal import ANONYMOUS, PrincipalMappingError
from exactly.security.sasl import Action, SaslAuthenticator, SaslState, Step
from exactly.security.tls import certificate_principal
from exactly.server.deferred_response import Deferred, ExclusiveAnswer, PendingAnswer
from exactly.server.dispatch import CloseConnection, dispatch, fast_answer
from exactly.server.plain_write import write_plain
from exactly.server.tls_write import write_tls

if TYPE_CHECKING:
    from exactly.server.broker import Broker

log = logging.getLogger("exactly.connection")
audit = logging.getLogger("exactly.security.audit")

PENDING_MAX_BYTES = 4 * 1024 * 1024  # gathered response bytes that force a write
# APIs whose handlers never await (answered within the dispatch call), or, for a cluster's
# acks=all Produce, call ``ctx.before_park`` (which writes what is held back) before they do: the
# only ones handled while earlier responses are held back for a combined write
NEVER_WAIT = frozenset({ApiKey.PRODUCE, ApiKey.LIST_OFFSETS, ApiKey.METADATA, ApiKey.API_VERSIONS})
MAX_QUEUED_FRAMES = 32  # read-ahead before we stop reading the socket
# Produces handled while earlier ones wait for the ISR (a client keeps at most 5 in flight per
# connection: librdkafka's max.in.flight with idempotence, the Java client's default)
MAX_DEFERRED = 16
WRITE_HIGH_WATER = 8 * 1024 * 1024
# the listener of a connection made without one (tests that drive a connection directly)
PLAINTEXT_LISTENER = ListenerSecurity(ListenerSpec("PLAINTEXT", SecurityProtocol.PLAINTEXT, "", 0))


class KafkaConnection(asyncio.BufferedProtocol):
    """One accepted socket, from ``connection_made`` to ``connection_lost``.

    Owns: the transport, the framer (read buffers, queued whole frames, the free-list of
    large-frame buffers), the task that handles the queued frames one at a time (``_process``),
    the read-ahead and write back-pressure state, and the idle-tracking fields the broker's
    reaper reads (``last_active``, ``in_request``).

    Lifecycle: ``connection_made`` registers it in ``broker.connections`` and starts the task ->
    requests are handled until the peer closes, a frame or request makes Kafka close it
    (``_close``: log line, then ``transport.close()`` after the queued writes), it idles out
    (``close_idle``) or the broker shuts down (``abort``: no flushing; in cluster mode ``drain``
    first: the request being handled is answered, then the connection closes after its writes)
    -> ``connection_lost`` unregisters it and cancels the task. ``_closing`` only ever goes from
    False to True."""

    def __init__(self, broker: Broker, listener: ListenerSecurity | None = None) -> None:
        self.broker = broker
        self.listener = listener if listener is not None else PLAINTEXT_LISTENER
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.principal = ANONYMOUS
        # the SASL exchange, until it is complete (None: no SASL on this listener, or done)
        self.sasl: SaslAuthenticator | None = None
        self.framer = Framer(broker.max_request_size)
        # the transport asks for a buffer ~3 times per large frame: hand it the framer's method
        # itself, one Python call fewer each time (the profile of a bulk produce shows it)
        self.get_buffer = self.framer.get_buffer  # type: ignore[method-assign]
        # TLS: the protocol exists from the accept, but ``connection_made`` comes only after a
        # successful handshake; a failed one (bad or expired certificate, a plaintext client)
        # drops this object without another callback, so its finalizer counts the failure.
        self._handshake_done = [False]
        if self.listener.ssl_context is not None:
            finalizer = weakref.finalize(
                self, _tls_handshake_failed, self._handshake_done, broker.metrics, self.listener.name
            )
            finalizer.atexit = False  # not at interpreter exit: nothing failed then
        self._frames = self.framer.frames  # whole frames not yet handled, in arrival order
        self._wakeup: asyncio.Future[None] | None = None
        self._writable: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        # answers of deferred requests (acks=all produces waiting for the ISR), in request order
        self._deferred: deque[asyncio.Future[list[Any] | None] | PendingAnswer[list[Any] | None]] = deque()
        # True only while ``_process`` waits for a frame or an answer with nothing held back:
        # then an answer resolved by a call (``_answered``) may be written from that call
        self._idle = False
        self._write = write_plain
        self._paused_reading = False
        self._closing = False
        self._draining = False
        self._lost: asyncio.Future[None] | None = None
        # connections.max.idle.ms: the loop time of the last bytes in or request answered, and
        # whether a request is being handled (a parked Fetch is not idle)
        self.last_active = time.monotonic()
        self.in_request = False

    # ---- protocol callbacks -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._handshake_done[0] = True
        self.transport = typing.cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        self.broker.connections.add(self)
        listener = self.listener
        if listener.ssl_context is not None and not listener.protocol.sasl:
            try:
                principal = certificate_principal(
                    transport.get_extra_info("ssl_object"), listener.principal_rules
                )
            except PrincipalMappingError as exc:
                self._audit(False, "SSL", ANONYMOUS, str(exc))
                self._close(f"client certificate not mapped to a principal: {exc}")
                return
            if principal is not None:
                self.principal = principal
                self._audit(True, "SSL", principal, "client certificate")
        if listener.protocol.sasl:
            broker = self.broker
            self.sasl = SaslAuthenticator(
                listener.mechanisms, listener.plain_users, broker.credentials.lookup
            )
            self.framer.set_max_frame_size(broker.sasl_max_receive_size)
        if listener.ssl_context is not None:
            self._write = write_tls  # in pieces
        loop = asyncio.get_running_loop()
        self._lost = loop.create_future()
        self._task = loop.create_task(self._process(), name=f"conn-{self.peer}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.broker.connections.discard(self)
        self._closing = True
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)
        if self._task is not None and not self._task.done():
            self._task.cancel()

    def get_buffer(self, sizehint: int) -> memoryview:
        """Replaced per instance by the framer's own ``get_buffer`` (see ``__init__``)."""
        return self.framer.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self.last_active = time.monotonic()
        frames = self._frames
        queued = len(frames)
        try:
            self.framer.buffer_updated(nbytes)
        except FrameError as exc:
            self._close(str(exc))
            return
        if len(frames) == queued:
            return
        if queued == 0 and len(frames) == 1 and self._idle and self._answer_inline(frames[0]):
            return
        if len(frames) >= MAX_QUEUED_FRAMES and not self._paused_reading and self.transport is not None:
            self.transport.pause_reading()
            self._paused_reading = True
        self._wake()

    def _answer_inline(self, payload: bytearray) -> bool:
        """Answer a lone frame from this read callback when a fast path takes it whole
        (``dispatch.fast_answer``: the common Produce, the common consumer Fetch), without
        waking ``_process``: a future, its result and a task step per request, which the
        latency-1k profile shows (bench/results/fetch-fast-s17.md). Only while ``_process`` sits
        idle with nothing held back, nothing deferred, nothing else queued and the socket
        writable, so the order of answers is the one ``_process`` would give. False: not taken,
        nothing changed, ``_process`` handles the frame as usual."""
        transport = self.transport
        if self._deferred or self.sasl is not None or self._closing or self._draining:
            return False
        if (
            transport is None
            or len(payload) >= LARGE_FRAME
            or not (self._writable is None or self._writable.done())
        ):
            return False
        try:
            result = fast_answer(self.broker, payload, True, self.listener.ssl_context is None)
            if result is None:
                return False
            self._frames.popleft()
            self.broker.metrics.bytes_in += len(payload) + 4
            if isinstance(result, Deferred):  # a parked Fetch: ``_answered`` writes it
                answer = result.answer
                assert isinstance(answer, PendingAnswer)
                self._deferred.append(answer)
                answer.listen(self._answered)
            else:
                self._write(transport, result)
        except Exception:
            log.exception("unexpected error on connection from %s; closing it", self.peer)
            self._close("internal error")
        return True

    def pause_writing(self) -> None:
        if self._writable is None or self._writable.done():
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def _close(self, reason: str, level: int = logging.WARNING) -> None:
        if not self._closing:
            log.log(level, "closing connection from %s: %s", self.peer, reason)
        self._closing = True
        if self.transport is not None:
            self.transport.close()

    # ---- request processing -------------------------------------------------------------------
    def _wake(self, _done: object = None) -> None:
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    def _blocked(self) -> bool:
        """Whether the next frame must wait for the deferred answers: only a Produce may be
        handled while earlier Produces wait for the ISR, and at most MAX_DEFERRED of them; nothing
        while a parked Fetch waits (``ExclusiveAnswer``)."""
        deferred = self._deferred
        if not deferred:
            return False
        if _api_key(self._frames[0]) != ApiKey.PRODUCE or len(deferred) >= MAX_DEFERRED:
            return True
        return any(type(answer) is ExclusiveAnswer for answer in deferred)  # a parked Fetch

    async def _process(self) -> None:
        loop = asyncio.get_running_loop()
        broker = self.broker
        transport = self.transport
        assert transport is not None
        frames = self._frames
        deferred = self._deferred
        release = self.framer.release
        write = self._write
        file_slices = self.listener.ssl_context is None  # sendfile bypasses TLS
        listener_name = self.listener.name
        pending: list[Any] = []  # responses held back for one combined write, in request order
        pending_bytes = 0

        def flush_held() -> None:
            """A handler is about to park (an acks=all produce waiting for the ISR)."""
            nonlocal pending, pending_bytes
            if pending:
                write(transport, pending)
                pending, pending_bytes = [], 0

        try:
            while not self._closing:
                # Answers of deferred requests follow ``pending`` (held back before them): the
                # finished ones at the head join it, in order.
                while deferred and deferred[0].done():
                    chunks = deferred.popleft().result()
                    if chunks is not None:
                        pending.extend(chunks)
                        for c in chunks:
                            pending_bytes += len(c)
                if self._draining and not deferred:
                    if pending:
                        write(transport, pending)
                    self._close("broker shutting down", logging.DEBUG)
                    return
                if not frames or self._draining or (deferred and self._blocked()):
                    if pending:
                        write(transport, pending)
                        pending, pending_bytes = [], 0
                        if self._writable is not None and not self._writable.done():
                            await self._writable
                            continue
                    self._wakeup = loop.create_future()  # a frame or a deferred answer
                    self._idle = True
                    try:
                        await self._wakeup
                    finally:
                        self._idle = False
                    continue
                payload = frames.popleft()
                if self._paused_reading and len(frames) < MAX_QUEUED_FRAMES // 2:
                    transport.resume_reading()
                    self._paused_reading = False
                if pending and _api_key(payload) not in NEVER_WAIT:
                    # this request may park
                    write(transport, pending)
                    pending, pending_bytes = [], 0
                broker.metrics.bytes_in += len(payload) + 4
                if self.sasl is not None:
                    step = self.sasl.receive(payload)
                    if step.action is not Action.DISPATCH:
                        if step.response:
                            pending.append(step.response)
                        if pending:
                            write(transport, pending)
                            pending, pending_bytes = [], 0
                        if not self._sasl_step(step):
                            return
                        continue
                self.in_request = True
                try:
                    result = await dispatch(
                        broker,
                        payload,
                        self.peer,
                        flush_held,
                        True,
                        file_slices,
                        principal=self.principal,
                        listener=listener_name,
                    )
                except CloseConnection as exc:
                    if pending and not self._closing:
                        write(transport, pending)  # answers owed to earlier requests
                    self._close(str(exc))
                    return
                self.in_request = False
                self.last_active = time.monotonic()
                # nothing but this frame's local holds the buffer (a memoryview into it would
                # count): reuse it for a later large frame
                if len(payload) >= LARGE_FRAME and sys.getrefcount(payload) == 2:
                    release(payload)
                if self._closing:
                    if isinstance(result, Deferred):  # nobody is left to answer
                        answer = result.answer
                        if isinstance(answer, PendingAnswer):
                            answer.cancel()
                        else:
                            answer.close()
                    continue
                if isinstance(result, Deferred):
                    answer = result.answer
                    if isinstance(answer, PendingAnswer):
                        deferred.append(answer)
                        answer.listen(self._answered)
                    else:
                        task = loop.create_task(answer)
                        task.add_done_callback(self._wake)
                        deferred.append(task)
                elif deferred:  # answered now, but after the deferred ones before it
                    if result is not None:
                        done: asyncio.Future[list[Any] | None] = loop.create_future()
                        done.set_result(result)
                        deferred.append(done)
                    continue
                elif result is None:
                    continue
                elif not pending and not frames:  # one request in flight, the usual case: write it as is
                    write(transport, result)
                else:
                    pending.extend(result)
                    for c in result:
                        pending_bytes += len(c)
                if frames and pending_bytes < PENDING_MAX_BYTES and len(frames[0]) < LARGE_FRAME:
                    continue  # a small request is queued: answer it together with this one
                if pending:
                    write(transport, pending)
                    pending, pending_bytes = [], 0
                if self._writable is not None and not self._writable.done():
                    await self._writable
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("unexpected error on connection from %s; closing it", self.peer)
            self._close("internal error")
        finally:
            for waiting in deferred:  # the connection is gone: nobody is left to answer
                waiting.cancel()
            deferred.clear()

    def _answered(self) -> None:
        """A deferred answer was resolved by a call (the follower fetch that moved the high
        watermark, a timer, a role change): when ``_process`` sits idle, write the finished
        answers at the head of the queue from this call, before whatever resolved it answers
        its own request (see ``deferred_response``); otherwise ``_process`` writes them in order
        when it gets to them."""
        deferred = self._deferred
        writable = self._writable is None or self._writable.done()
        transport = self.transport
        idle = self._idle and writable and not self._closing and transport is not None
        if idle and transport is not None and deferred and deferred[0].done():
            chunks: list[Any] = []
            while deferred and deferred[0].done():
                answered = deferred.popleft().result()
                if answered is not None:
                    chunks.extend(answered)
            if chunks:
                self._write(transport, chunks)
            if not self._frames and not self._draining:
                return  # nothing for _process to do: it stays parked
        self._wake()

    def _sasl_step(self, step: Step) -> bool:
        """Act on an authenticator step whose response is written; False: stop serving."""
        sasl = self.sasl
        assert sasl is not None
        if step.action is Action.REPLY:
            return True
        if step.action is Action.AUTHENTICATED:
            self.principal = step.principal
            self.sasl = None
            self.framer.set_max_frame_size(self.broker.max_request_size)
            self._audit(True, step.mechanism, step.principal, "SASL")
            return True
        self._audit(False, step.mechanism or "SASL", ANONYMOUS, step.reason)
        if step.action is Action.CLOSE:
            self._close(f"SASL: {step.reason}")
            return False
        # FAIL: nothing more is read or served; the close comes after Kafka's delay
        assert sasl.state is SaslState.FAILED
        self._frames.clear()
        if self.transport is not None and not self._paused_reading:
            self.transport.pause_reading()
            self._paused_reading = True
        delay = self.broker.failed_auth_delay_s
        asyncio.get_running_loop().call_later(
            delay, self._close, f"SASL authentication failed: {step.reason}"
        )
        self._closing = True  # _process ends; _close still closes (transport.close is idempotent)
        return False

    def _audit(self, ok: bool, mechanism: str, principal: str, detail: str) -> None:
        """Count the outcome and write the audit line: who (peer, principal), how, the result;
        ``detail`` never holds a secret (the SASL layer's reasons name users, not passwords)."""
        self.broker.metrics.authentication(self.listener.name, mechanism, ok)
        audit.log(
            logging.INFO if ok else logging.WARNING,
            "authentication %s: listener=%s peer=%s mechanism=%s principal=%s (%s)",
            "succeeded" if ok else "failed",
            self.listener.name,
            self.peer,
            mechanism,
            principal,
            detail,
        )

    def idle_for(self, now: float) -> float:
        """Seconds without a byte received or a request answered; 0 while a request is being
        handled or is queued (Kafka counts any channel activity; ours is request-granular)."""
        if self.in_request or self._frames or self._deferred or self.framer.receiving_large:
            return 0.0
        return now - self.last_active

    def close_idle(self, idle_s: float) -> None:
        """connections.max.idle.ms expired: close as Kafka's selector does (debug log only)."""
        self._close(f"idle for {idle_s * 1000:.0f} ms", logging.DEBUG)

    async def drain(self) -> None:
        """Broker shutdown (cluster mode): finish the request being handled, write every answer
        held back, close once the writes are out. Requests not started yet are dropped, as
        Kafka's socket server drops them. Returns when the connection is gone."""
        self._draining = True
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)
        if self._lost is not None:
            await asyncio.shield(self._lost)

    def abort(self) -> None:
        """Broker shutdown: drop the connection without waiting for in-flight work."""
        self._closing = True
        if self._task is not None:
            self._task.cancel()
        if self.transport is not None:
            self.transport.abort()


def _tls_handshake_failed(done: list[bool], metrics: Any, listener: str) -> None:
    """Finalizer of a TLS connection: counted and audited when it never completed its handshake
    (the peer is not known then: asyncio gives it to the protocol only after the handshake)."""
    if done[0]:
        return
    metrics.authentication(listener, "SSL", False)
    audit.warning(
        "authentication failed: listener=%s mechanism=SSL (TLS handshake did not complete)", listener
    )


def _api_key(payload: bytearray) -> int:
    """The API key of a request frame (-1 when too short: dispatch closes the connection)."""
    return (payload[0] << 8 | payload[1]) if len(payload) >= 2 else -1
