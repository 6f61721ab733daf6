"""A response whose request is done but whose answer is not ready yet (Kafka's delayed operations
seen from the connection).

A handler returns ``Deferred`` only when its ``RequestContext.may_defer`` says the connection can
take one, and only once every effect of the request has happened: what is left to await is the
answer alone (an acks=all produce appended to the leader's log and now waiting for the ISR). The
connection then handles the next request of the same kind while keeping the answers in request
order (see ``exactly.server.connection``); a caller that cannot (``may_defer`` False) gets the
handler's plain, awaited answer.
"""

from __future__ import annotations

from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Deferred(Generic[T]):
    """``answer`` finishes with the response (a handler's body, or dispatch's framed chunks)."""

    answer: Coroutine[Any, Any, T]
