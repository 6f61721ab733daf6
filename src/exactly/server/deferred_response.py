"""A response whose request is done but whose answer is not ready yet (Kafka's delayed operations
seen from the connection).

A handler returns ``Deferred`` only when its ``RequestContext.may_defer`` says the connection can
take one, and only once every effect of the request has happened: what is left to await is the
answer alone (an acks=all produce appended to the leader's log and now waiting for the ISR). The
connection then handles the next request of the same kind while keeping the answers in request
order (see ``exactly.server.connection``); a caller that cannot (``may_defer`` False) gets the
handler's plain, awaited answer.

``Deferred.answer`` is either a coroutine (the connection runs it as a task) or a
:class:`PendingAnswer`, which whoever completes the request resolves by a plain call. The
acks=all produce uses the latter: the follower fetch that moves the high watermark resolves the
produce's answer and the connection writes it in that same call, instead of three event-loop
hops later (a task wake-up, its done callback, the connection's own wake-up). Traced at 1,000
produces/s on a 3-broker cluster, those hops cost 0.3-0.4 ms at the median: the follower fetch's
own response went out first, woke the follower, and the follower took the leader's core.
A follower's Fetch parked on a cluster leader is answered the same way (``handlers.fetch``): the
leader's append resolves it, so the records leave for the followers from inside the append.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")
U = TypeVar("U")


class PendingAnswer(Generic[T]):
    """An answer resolved by a call, with one listener told synchronously (no task, no loop hop).

    Lifecycle: pending -> resolved (``set_result``, once; the listener runs inside that call) or
    pending -> cancelled (``cancel``: the connection is gone; the cancel hooks release whatever
    still waits to resolve it, e.g. a parked produce's entries). Resolving a cancelled answer is
    a no-op. The same ``done``/``result``/``cancel`` surface as an asyncio future, so the
    connection keeps both kinds in one queue.

    Invariant: a resolved or cancelled answer holds no listener and no cancel hook. The listener
    is usually a closure or bound method that refers back to this answer (``then``'s lambda, the
    connection's ``_answered``, a produce's ``settle``): kept after use, each acks=all produce left a
    reference cycle of ~7-14 objects that only the cyclic collector frees, every collection of a
    cluster leader at 1,000 acks=all produces/s found ~130 of them (bench/results/rf3tail-s18.md).
    Dropped here, reference counting frees the answer as soon as the connection has written it."""

    __slots__ = ("_cancelled", "_done", "_listener", "_on_cancel", "_result")

    def __init__(self) -> None:
        self._done = False
        self._cancelled = False
        self._result: T | None = None
        self._listener: Callable[[], None] | None = None
        self._on_cancel: list[Callable[[], None]] = []

    def done(self) -> bool:
        return self._done

    def result(self) -> T:
        if not self._done:
            raise asyncio.InvalidStateError("answer not ready")
        return self._result  # type: ignore[return-value]

    def set_result(self, value: T) -> None:
        if self._done or self._cancelled:
            return
        self._result = value
        self._done = True
        self._on_cancel.clear()
        listener, self._listener = self._listener, None  # told once: see the class docstring
        if listener is not None:
            listener()

    def listen(self, listener: Callable[[], None]) -> None:
        """``listener()`` runs inside ``set_result`` (at once if resolved already)."""
        if self._done:
            listener()
        elif not self._cancelled:
            self._listener = listener

    def on_cancel(self, hook: Callable[[], None]) -> None:
        self._on_cancel.append(hook)

    def cancel(self) -> bool:
        if self._done or self._cancelled:
            return False
        self._cancelled = True
        self._listener = None
        hooks, self._on_cancel = self._on_cancel, []
        for hook in hooks:
            hook()
        return True

    def _cancel_hook(self) -> None:
        self.cancel()

    def then(self, fn: Callable[[T], U]) -> PendingAnswer[U]:
        """An answer resolved with ``fn(result)`` when this one is; cancelling it cancels this."""
        out: PendingAnswer[U] = PendingAnswer()
        out.on_cancel(self._cancel_hook)
        self.listen(lambda: out.set_result(fn(self.result())))
        return out

    async def wait(self) -> T:
        """For a caller that cannot take a deferred answer: await it (cancelled with the caller)."""
        if not self._done:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

            def wake() -> None:
                if not fut.done():
                    fut.set_result(None)

            self.listen(wake)
            try:
                await fut
            except asyncio.CancelledError:
                self.cancel()
                raise
        return self.result()


class ExclusiveAnswer(PendingAnswer[T]):
    """A pending answer no later request of its connection may overtake: the connection handles
    nothing after it until it is written (a parked consumer Fetch of ``server.fetch_fast``,
    which the generic path awaits in place, so a Produce behind it on the same connection is
    not handled before it is answered, as in Kafka)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Deferred(Generic[T]):
    """``answer`` finishes with the response (a handler's body, or dispatch's framed chunks)."""

    answer: Coroutine[Any, Any, T] | PendingAnswer[T]
