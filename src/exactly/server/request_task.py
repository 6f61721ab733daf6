"""The request side of a client connection: whole frames handled one at a time, answers written
strictly in request order (``RequestTask``, mixed into ``connection.KafkaConnection``).

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

The frames of a read that a fast path takes whole (the common single-broker Produce and consumer
Fetch, ``dispatch.fast_answer``) are answered from the read callback itself, in order and with one
write, when the request task sits idle with nothing held back or deferred: no future, no task
step per request. The first frame a fast path declines (or a large one) and everything behind it
go to the request task, which calls ``fast_answer`` itself too (a plain call, no coroutine) and
``dispatch.dispatch`` (``fast_paths=False``) for the rest. A parked consumer Fetch of the fast path
(``ExclusiveAnswer``) holds back every later request, as an awaited one.

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

Why a mixin and not an object of its own: these methods run per request (``_answer_inline`` from
the read callback, ``_process``'s loop, ``_answered`` from the call that resolves an answer) and
read the connection's state on every step; as methods of the connection itself they cost no
extra call or attribute hop per request, which is what the read-callback answers are for.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from exactly.protocol.apis import ApiKey
from exactly.protocol.framing import LARGE_FRAME
from exactly.security.sasl import Action
from exactly.server.deferred_response import Deferred, ExclusiveAnswer, PendingAnswer
from exactly.server.dispatch import CloseConnection, dispatch, fast_answer

if TYPE_CHECKING:
    from collections.abc import Callable

    from exactly.protocol.framing import Framer
    from exactly.security.listener_security import ListenerSecurity
    from exactly.security.sasl import SaslAuthenticator, Step
    from exactly.server.broker import Broker

log = logging.getLogger("exactly.connection")

PENDING_MAX_BYTES = 4 * 1024 * 1024  # gathered response bytes that force a write
# APIs whose handlers never await (answered within the dispatch call), or, for a cluster's
# acks=all Produce, call ``ctx.before_park`` (which writes what is held back) before they do: the
# only ones handled while earlier responses are held back for a combined write
NEVER_WAIT = frozenset({ApiKey.PRODUCE, ApiKey.LIST_OFFSETS, ApiKey.METADATA, ApiKey.API_VERSIONS})
MAX_QUEUED_FRAMES = 32  # read-ahead before we stop reading the socket
# Produces handled while earlier ones wait for the ISR (a client keeps at most 5 in flight per
# connection: librdkafka's max.in.flight with idempotence, the Java client's default)
MAX_DEFERRED = 16


class RequestTask:
    """The request task of ``KafkaConnection`` and the read-callback answers, as methods of it.

    Invariants: answers are written in the order their frames arrived; at most one request is
    being dispatched (``_process`` awaits it) and nothing else is handled meanwhile but a
    Produce behind deferred Produces (``_blocked``); ``_idle`` is True only while ``_process``
    waits with nothing held back in its ``pending``, which is what lets ``_answer_inline`` and
    ``_answered`` write from a callback without overtaking an answer.

    The connection owns and initialises every attribute below (``KafkaConnection.__init__``);
    the request state proper is ``_frames`` (the framer's queue of whole frames), ``_deferred``,
    ``_wakeup`` and ``_idle``."""

    if TYPE_CHECKING:  # provided by KafkaConnection
        broker: Broker
        listener: ListenerSecurity
        transport: asyncio.Transport | None
        peer: str
        principal: str
        sasl: SaslAuthenticator | None
        framer: Framer
        _frames: deque[bytearray]
        _wakeup: asyncio.Future[None] | None
        _writable: asyncio.Future[None] | None
        _deferred: deque[asyncio.Future[list[Any] | None] | PendingAnswer[list[Any] | None]]
        _idle: bool
        _write: Callable[[asyncio.Transport, list[Any]], None]
        _paused_reading: bool
        _closing: bool
        _draining: bool
        last_active: float
        in_request: bool

        def _close(self, reason: str, level: int = logging.WARNING) -> None: ...

        def _sasl_step(self, step: Step) -> bool: ...

    def _answer_inline(self) -> None:
        """Answer the queued frames a fast path takes whole (``dispatch.fast_answer``: the common
        Produce, the common consumer Fetch) from the read callback (``buffer_updated``), without
        waking ``_process``: a future, its result and a task step per request, which the
        latency-1k profile shows (bench/results/fetch-fast-s17.md). Only while ``_process`` sits
        idle with nothing held back, nothing deferred and the socket writable, so the order of
        answers is the one ``_process`` would give: frames are taken from the head of the queue
        one at a time, in order, and the first one that is large or that ``fast_answer``
        declines stops it (``_process`` handles that one and everything after it). Several
        frames of one read (two pipelined Produces, a Produce and a Fetch) are answered with one
        write, as ``_process`` gathers them. A Fetch that parks (a ``Deferred``) ends it too:
        what was gathered is written first, then its answer is queued for ``_answered`` and
        holds back every later frame (``_blocked``)."""
        transport = self.transport
        if self._deferred or self.sasl is not None or self._closing or self._draining:
            return
        if transport is None or not (self._writable is None or self._writable.done()):
            return
        frames = self._frames
        broker = self.broker
        file_slices = self.listener.ssl_context is None
        out: list[Any] | None = None  # answers gathered for one write, in request order
        try:
            while frames:
                payload = frames[0]
                if len(payload) >= LARGE_FRAME:
                    break  # _process handles it, writing what is gathered first
                result = fast_answer(broker, payload, True, file_slices)
                if result is None:
                    break  # declined, nothing changed: _process answers it on its turn
                frames.popleft()
                broker.metrics.bytes_in += len(payload) + 4
                if isinstance(result, Deferred):  # a parked Fetch: ``_answered`` writes it
                    if out:
                        self._write(transport, out)
                        out = None
                    answer = result.answer
                    assert isinstance(answer, PendingAnswer)
                    self._deferred.append(answer)
                    answer.listen(self._answered)
                    break
                if out is None:
                    out = result  # a fresh list of this answer's own (the fast paths build it)
                else:
                    out += result
            if out:
                self._write(transport, out)
        except Exception:
            log.exception("unexpected error on connection from %s; closing it", self.peer)
            self._close("internal error")

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
                # the fast paths first, as a plain call (``dispatch`` without its coroutine)
                result = fast_answer(broker, payload, True, file_slices)
                if result is None:
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
                            fast_paths=False,
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
        if idle and transport is not None and deferred:
            # one ``done()`` per answer taken (this loop's own check is the head's only one)
            chunks: list[Any] | None = None
            while deferred and deferred[0].done():
                answered = deferred.popleft().result()
                if chunks is None:
                    chunks = []
                if answered is not None:
                    chunks.extend(answered)
            if chunks is not None:  # the head was finished: what it freed is written here
                if chunks:
                    self._write(transport, chunks)
                if not self._frames and not self._draining:
                    return  # nothing for _process to do: it stays parked
        self._wake()


def _api_key(payload: bytearray) -> int:
    """The API key of a request frame (-1 when too short: dispatch closes the connection)."""
    return (payload[0] << 8 | payload[1]) if len(payload) >= 2 else -1
