"""One client connection: the socket side (receive, flow control, security, closing) of
``KafkaConnection``; the request side, frames handled one at a time and answered strictly in
request order, is ``exactly.server.request_task`` (``RequestTask``, a mixin of this class: what
runs per request stays a method of the connection, no extra call).

Receiving goes through the sans-IO framer (exactly.protocol.framing): this class is an
``asyncio.BufferedProtocol`` whose ``get_buffer``/``buffer_updated`` hand the socket's bytes to
it, so the kernel writes a large frame's body straight into the bytearray that becomes the
request. The request task hands each frame to the dispatcher (exactly.server.dispatch); once it is
answered and nothing references a large frame's buffer any more, the buffer goes back to the
framer's free-list for a later large frame.

Sending goes through ``self._write``: ``plain_write.write_plain`` (corked, sendfile for Fetch
data) or, on a TLS listener, ``tls_write.write_tls``; which responses are gathered into one write
is the request task's business (see there). Write back-pressure (``pause_writing``) makes the
request task wait before it handles the next frame; read-ahead stops at MAX_QUEUED_FRAMES.

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
import time
import typing
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any

from exactly.protocol.framing import FrameError, Framer
from exactly.security.listener_security import ListenerSecurity
from exactly.security.listeners import ListenerSpec, SecurityProtocol
from exactly.security.principal import ANONYMOUS, PrincipalMappingError
from exactly.security.sasl import Action, SaslAuthenticator, SaslState, Step
from exactly.security.tls import certificate_principal
from exactly.server.deferred_response import PendingAnswer
from exactly.server.plain_write import write_plain
from exactly.server.request_task import MAX_QUEUED_FRAMES, RequestTask
from exactly.server.tls_write import write_tls

if TYPE_CHECKING:
    from exactly.server.broker import Broker

log = logging.getLogger("exactly.connection")
audit = logging.getLogger("exactly.security.audit")

WRITE_HIGH_WATER = 8 * 1024 * 1024
# the listener of a connection made without one (tests that drive a connection directly)
PLAINTEXT_LISTENER = ListenerSecurity(ListenerSpec("PLAINTEXT", SecurityProtocol.PLAINTEXT, "", 0))


class KafkaConnection(RequestTask, asyncio.BufferedProtocol):
    """One accepted socket, from ``connection_made`` to ``connection_lost``.

    Owns: the transport, the framer (read buffers, queued whole frames, the free-list of
    large-frame buffers), the task that handles the queued frames one at a time
    (``RequestTask._process``; its state is initialised here too), the read-ahead and write
    back-pressure state, and the idle-tracking fields the broker's reaper reads
    (``last_active``, ``in_request``).

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
        if queued == 0 and self._idle:
            self._answer_inline()  # the fast paths' frames at the head of the queue, in order
            if not frames:
                return
        if len(frames) >= MAX_QUEUED_FRAMES and not self._paused_reading and self.transport is not None:
            self.transport.pause_reading()
            self._paused_reading = True
        self._wake()

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

    # ---- security ------------------------------------------------------------------------------
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
