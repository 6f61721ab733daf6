"""Delayed fetches (Kafka's DelayedFetch purgatory): long-polling Fetch requests park here until
one of their partitions gets data or their max_wait_ms runs out.

On a single broker the only event that can complete a parked fetch early is an append to one of
its partitions (the high watermark follows the log end at once). On a cluster leader an append
moves the log end (what a follower reads up to) and a follower's fetch moves the high watermark
(what a consumer reads up to): each wakes only the fetches it can complete. The Fetch handler
re-reads its partitions when ``wait`` returns, whatever woke it, so a spurious wake-up costs one
read and no correctness. The cluster's delayed produce (acks=all waiting on the ISR) is
``delayed_produce``.

A follower's fetch on a cluster leader parks as a ``ParkedFetch`` instead (``park``): the leader's
append calls it and it answers from inside that call (``handlers.fetch``), so the record leaves for
the followers before the produce handler even returns, not a task wake-up and an event-loop turn
later (on a loaded 2-core box that turn is where other processes' and connections' work cut in:
0.4 ms at the median from append to follower answer, traced at 1,000 acks=all produces/s).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from exactly.types import TopicPartition

if TYPE_CHECKING:
    from exactly.storage.partition_log import PartitionLog

log = logging.getLogger(__name__)

# ``AppendWaiters._deadlines`` is compacted once it holds more entries than this (and than twice
# its live entries at the last compaction)
_COMPACT_MIN = 64

# A partition's key in the waiter sets: (topic, partition). Why not the ``TopicPartition``: its
# hash is a Python-level ``__hash__`` (a dataclass's), five calls per woken fetch at latency-1k
# (register, notify, unregister); a tuple of a str and an int hashes in C.
_Key = tuple[str, int]

# A parked fetch's completion: prepares its answer, returns what sends it (None: nothing to send).
Fire = Callable[[], Callable[[], None] | None]

Tail = tuple["PartitionLog", int, int, bytearray, int, int]
"""The batch an append just wrote, as a single broker's Produce fast path hands it to ``notify``:
(log, base offset, next offset, the request frame, the batch's start and stop in it). The frame's
bytes there are the batch as written (offsets patched in place). A consumer fetch woken by that
append may answer from them instead of reading the log (``fetch_fast._Parked.fire`` checks that
the batch is still everything its read would return). Nothing writes into a frame once it is
handled, and a large frame's buffer goes back to the framer's free-list only while nothing else
references it (``RequestTask._process``), so a held frame keeps its bytes until the fire drops it."""


class ParkedFetch:
    """A fetch parked by a call: ``fire()`` runs once, when a notify or its timer completes it.

    Duck-types the two methods of a future that ``_wake_all`` uses (``done``, ``set_result``), so
    both kinds share the waiter sets. Lifecycle: parked -> fired (by a notify or the timer; it
    leaves every set and cancels its timer before ``fire`` runs, so ``fire`` may park anew) or
    parked -> cancelled (``cancel``: its connection is gone). Invariant: an entry is in the sets
    exactly while it is neither fired nor cancelled.

    ``fire`` works in two steps: it prepares the answer (reads, encodes) and returns what sends it
    (None: nothing to send, e.g. it parked again). ``notify_appended`` (the leader's own append, the
    hot path) fires inside the call, preparing every parked fetch of the partition before sending
    any: the first answer written wakes its follower, which on a busy 2-core box takes the leader's
    core at once, and the acks=all produce needs the other follower's answer too (traced: 0.4 ms at
    the median between the two when each was written as soon as it was read). ``notify`` (role
    changes, epoch bumps, a single broker's append) fires it on the next loop turn, as a woken task
    would run, so it never reads a partition in the middle of a role change."""

    __slots__ = ("_done", "_fire", "_keys", "_loop", "_sets", "_soon", "tail")

    def __init__(
        self,
        sets: dict[_Key, set[_Waiter]],
        keys: list[_Key],
        fire: Fire,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self._done = False
        self._soon = False  # ``fire_soon`` scheduled it: several appends in one turn, one read
        self._fire = fire
        self._keys = keys
        self._sets = sets
        # the loop it was parked on (its timer's): ``fire_soon`` schedules there without
        # ``asyncio.get_running_loop()``, which costs a getpid system call per call
        self._loop = loop
        # the batch whose append woke it (``fire_soon``), for ``fire`` to read while it runs;
        # None: woken otherwise (its timer, a role change, the generic path's append, two
        # appends in one turn), or not woken yet. Dropped once ``fire`` returns.
        self.tail: Tail | None = None

    def done(self) -> bool:
        return self._done

    def set_result(self, _value: None) -> None:
        """Fire now, both steps (the name is the future's: the timer and ``fire_soon`` call it).
        ``prepare`` unfolded (a call per woken fetch): leave the sets, then fire."""
        if self._done:
            return
        fire = self._fire
        self._detach()
        try:
            send = fire()
        finally:
            self.tail = None  # a stale deadline entry keeps no frame alive
        if send is not None:
            send()

    def prepare(self) -> Callable[[], None] | None:
        """Leave the sets and prepare the answer; the caller sends it with the result."""
        if self._done:
            return None
        fire = self._fire
        self._detach()
        try:
            return fire()
        finally:
            self.tail = None

    def fire_soon(self, tail: Tail | None = None) -> None:
        """Fire on the next loop turn (once however many appends notify it before then);
        ``tail``: the batch the notifying append wrote, kept for ``fire`` while it is the only
        one (a second append in the same turn drops it: the fetch then reads the log)."""
        if self._done:
            return
        if not self._soon:
            self._soon = True
            self.tail = tail
            loop = self._loop if self._loop is not None else asyncio.get_running_loop()
            loop.call_soon(self.set_result, None)
        else:
            self.tail = None

    def cancel(self) -> None:
        if not self._done:
            self._detach()
            self.tail = None

    def _detach(self) -> None:
        self._done = True
        # its deadline entry stays in ``AppendWaiters._deadlines`` until due or compacted: keep
        # nothing of the fetch alive through it
        self._fire = _fired
        _unregister(self._sets, self._keys, self)


def _fired() -> None:
    """A detached ``ParkedFetch``'s ``fire`` (never called: ``prepare`` checks ``done`` first)."""


_Waiter = asyncio.Future[None] | ParkedFetch
_NO_KEYS: list[_Key] = []  # a ParkedFetch's keys until ``_register`` returns them (never mutated)


class AppendWaiters:
    """Parked fetches by partition, in two kinds by the offset their read is bound by.

    A consumer's fetch reads up to the high watermark (or the last stable offset, which only
    moves with it); a follower's reads up to the log end. Kafka's DelayedFetch completes once the
    bytes below that bound reach MinBytes, so on a cluster leader an append alone cannot complete
    a consumer's fetch and a high-watermark move alone cannot complete a follower's:
    ``notify_appended`` and ``notify_high_watermark`` wake only the kind the event can complete.
    Waking the other kind would cost a re-read and a re-park on the leader's loop per produce for
    nothing (two followers and a consumer: three spurious wake-ups per acks=all produce at RF 3).
    ``notify`` wakes both (a single broker's append moves both bounds; a role change answers
    every parked fetch NOT_LEADER_OR_FOLLOWER).

    Owns ``_waiters`` (high-watermark bound) and ``_log_end`` (log-end bound): for each partition,
    the futures of the fetches parked on it; a fetch parked on several partitions has one future
    in each set. Lifecycle of an entry: added by ``wait``, completed by a notify or by the
    fetch's timer, and removed by ``wait`` itself when it returns (woken, timed out, or
    cancelled because its connection closed), so nothing outlives its fetch. One instance per
    broker (``Broker.waiters``), for the broker's life. Spurious wake-ups are harmless: the Fetch
    handler re-reads whatever woke it.

    A waiting fetch is a bare future plus one ``loop.call_at`` timer: ``asyncio.wait_for`` would
    add a Task and a second future per wait, which showed up in the 1,000 msg/s latency profile
    (every record wakes the consumer's parked Fetch). The notifies run after every append, so
    they return before hashing anything when no fetch is parked (the usual case while
    producing)."""

    def __init__(self) -> None:
        self._waiters: dict[_Key, set[_Waiter]] = {}
        self._log_end: dict[_Key, set[_Waiter]] = {}
        # ``park``'s deadlines, one loop timer for the earliest (see ``park``)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._deadlines: list[tuple[float, int, ParkedFetch]] = []  # a heap
        self._seq = itertools.count()  # ties: no ParkedFetch comparison
        self._compact_at = _COMPACT_MIN
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    async def wait(
        self, tps: Iterable[TopicPartition], timeout_s: float, *, up_to_log_end: bool = False
    ) -> None:
        """Park until a notify for one of ``tps`` that can complete this kind of read (a
        follower's, bound by the log end, with ``up_to_log_end``) or ``timeout_s``."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        waiters = self._log_end if up_to_log_end else self._waiters
        keys = _register(waiters, tps, fut)
        timer = loop.call_at(loop.time() + timeout_s, _wake, fut)
        try:
            await fut
        finally:
            timer.cancel()
            _unregister(waiters, keys, fut)

    def park(
        self, tps: list[TopicPartition], timeout_s: float, fire: Fire, *, up_to_log_end: bool
    ) -> ParkedFetch:
        """Park a fetch that ``fire()`` completes (no task; see ``ParkedFetch``), for the same
        events ``wait`` would wake it for, or until ``timeout_s``."""
        waiters = self._log_end if up_to_log_end else self._waiters
        loop = self._loop
        if loop is None or not loop.is_running():  # first park, or a new loop (tests)
            loop = self._loop = asyncio.get_running_loop()
            self._timer, self._timer_at = None, math.inf  # a closed loop's timer never runs
        parked = ParkedFetch(waiters, _NO_KEYS, fire, loop)
        parked._keys = _register(waiters, tps, parked)
        deadline = loop.time() + timeout_s
        deadlines = self._deadlines
        heapq.heappush(deadlines, (deadline, next(self._seq), parked))
        if deadline < self._timer_at:
            self._arm(loop, deadline)
        if len(deadlines) > self._compact_at:
            self._compact()
        return parked

    # Why one timer for every parked fetch and not a ``call_at`` each: at latency-1k each record
    # parks the consumer's Fetch and its wake-up cancelled the timer; a cancelled uvloop timer is
    # a handle closed on the next loop turn, and a pending close makes that turn's epoll_pwait
    # return at once (timeout 0): a system call, a loop turn and a timer handle per record (a
    # getpid too: ``asyncio.get_running_loop()`` costs one per call; the loop is kept here).
    # A deadline is a heap entry instead; a woken fetch leaves its entry behind (done, skipped),
    # and the heap is compacted when stale entries pile up (more than half of it), so it holds
    # O(parked fetches) entries. Deadlines are kept as before: each fetch fires when its own
    # max_wait is over, through the timer armed for the earliest one.

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(when, self._expire)
        self._timer_at = when

    def _expire(self) -> None:
        """The timer: fire every parked fetch whose max_wait is over, re-arm for the next."""
        self._timer, self._timer_at = None, math.inf
        loop = self._loop
        if loop is None:
            return
        # uvloop rounds a timer's delay to whole milliseconds: one armed for a deadline may run
        # up to half a millisecond before it, and that deadline is due
        now = loop.time() + 0.0005
        deadlines = self._deadlines
        due: list[ParkedFetch] = []
        while deadlines and (deadlines[0][0] <= now or deadlines[0][2]._done):
            parked = heapq.heappop(deadlines)[2]
            if not parked._done:
                due.append(parked)
        for parked in due:  # in deadline order; one may park again (and arm the timer)
            try:
                parked.set_result(None)
            except Exception:  # one fetch's failure must not keep the others parked
                log.exception("answering a parked fetch at its max_wait failed")
        deadlines = self._deadlines  # a fetch that parked again may have compacted the heap
        while deadlines and deadlines[0][2]._done:
            heapq.heappop(deadlines)
        if deadlines and deadlines[0][0] < self._timer_at:
            self._arm(loop, deadlines[0][0])

    def _compact(self) -> None:
        """Drop the entries of fetches no longer parked (woken or cancelled)."""
        live = [entry for entry in self._deadlines if not entry[2]._done]
        heapq.heapify(live)
        self._deadlines = live
        self._compact_at = max(_COMPACT_MIN, 2 * len(live))

    def notify(self, tp: TopicPartition, tail: Tail | None = None) -> None:
        """Both bounds may have moved (or the partition's role changed). ``tail``: the batch a
        single broker's append just wrote (see ``Tail``), offered to the consumer fetches it
        wakes."""
        if self._waiters:  # after every single-broker append: no call when nobody waits
            _wake_all(self._waiters, (tp.topic, tp.partition), now=False, tail=tail)
        if self._log_end:
            _wake_all(self._log_end, (tp.topic, tp.partition), now=False)

    def notify_appended(self, tp: TopicPartition) -> None:
        """The log end moved, the high watermark did not (a cluster leader's append): parked
        follower fetches answer inside this call."""
        _wake_all(self._log_end, (tp.topic, tp.partition), now=True)

    def notify_high_watermark(self, tp: TopicPartition) -> None:
        """The high watermark moved, the log end did not (a follower's fetch advanced it)."""
        _wake_all(self._waiters, (tp.topic, tp.partition), now=True)


def _register(
    waiters: dict[_Key, set[_Waiter]], tps: Iterable[TopicPartition], waiter: _Waiter
) -> list[_Key]:
    """Add ``waiter`` to the set of each of ``tps`` (a set is created on first use and deleted
    when its last waiter leaves, so an idle partition costs no entry); returns their keys."""
    keys: list[_Key] = []
    for tp in tps:
        key = (tp.topic, tp.partition)
        keys.append(key)
        entries = waiters.get(key)
        if entries is None:
            waiters[key] = {waiter}
        else:
            entries.add(waiter)
    return keys


def _unregister(waiters: dict[_Key, set[_Waiter]], keys: list[_Key], waiter: _Waiter) -> None:
    """Take ``waiter`` out of the set of each of ``keys``, deleting a set it leaves empty."""
    for key in keys:
        entries = waiters.get(key)
        if entries is not None:
            entries.discard(waiter)
            if not entries:
                del waiters[key]


def _wake_all(waiters: dict[_Key, set[_Waiter]], key: _Key, *, now: bool, tail: Tail | None = None) -> None:
    if not waiters:
        return
    parked = waiters.get(key)
    if not parked:
        return
    # a fired ParkedFetch leaves the set (and may park again) while this loop runs
    sends: list[Callable[[], None]] = []
    for waiter in tuple(parked):
        if type(waiter) is ParkedFetch:
            if waiter._done:
                continue
            if now:
                send = waiter.prepare()
                if send is not None:
                    sends.append(send)
            else:
                waiter.fire_soon(tail)
        elif not waiter.done():
            waiter.set_result(None)
    for send in sends:  # every answer ready: written back to back (see ParkedFetch)
        try:
            send()
        except Exception:  # the waker is an append: a failed answer must not fail it
            log.exception("sending a parked fetch's answer failed")


def _wake(fut: asyncio.Future[None]) -> None:
    """Timer callback of a parked fetch: its max_wait is over."""
    if not fut.done():
        fut.set_result(None)
