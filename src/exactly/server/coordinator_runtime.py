"""The one asyncio runtime that drives a sans-IO coordinator (Kafka's ``CoordinatorRuntime``).

Both the transaction coordinator (``__transaction_state``) and the group coordinator
(``__consumer_offsets``) are driven by a :class:`CoordinatorRuntime`; what differs between them
(configuration, the transaction markers, periodic scans, metrics) lives in the small bindings
``server/txn_runtime.py`` and ``server/group_runtime.py``.

Why this module: it decides *when* a coordinator operation runs -- lifecycle and loading,
ownership of the partitions, the operation lock of cluster mode, requests parked by token, timers
and periodic scans. *How* one operation's result reaches the internal topic (the writes appended
depth-first, each completion applied, the effects handed to the binding, the answers gathered)
is :mod:`exactly.server.coordinator_writes`, shared by both modes.

Theory of operation
-------------------
Every coordinator operation returns a :class:`~exactly.coordinator.result.CoordinatorResult`.
:meth:`CoordinatorRuntime.drive` has the
:class:`~exactly.server.coordinator_writes.ResultDriver` carry it out (every write appended and
completed, every effect handled) and only then delivers the request's ``response`` and the
parked requests' ``replies``.

Requests come in through :meth:`CoordinatorRuntime.call` (an asyncio future of the answer; the
coordinator may park the request by its token and answer it from a later operation) or
:meth:`CoordinatorRuntime.drive` (synchronous: the answer is returned).

Time: a timer task (none for a shard that keeps no timers: ``timers=False``) sleeps until the
coordinator's ``next_deadline`` (at most ``IDLE_POLL_S``) and
calls ``poll``; every result carried out that arms an earlier timer wakes it. Periodic scans (transaction
timeouts, offset retention) are registered with :meth:`CoordinatorRuntime.every`.

Loading is replay: :meth:`CoordinatorRuntime.load` feeds every batch of the topic, in offset
order, to the coordinator's ``replay`` / ``replay_end_transaction``, then drives
``load_complete``; :meth:`CoordinatorRuntime.unload` is the reverse (parked requests are answered
NOT_COORDINATOR, the state is dropped).

Cluster mode (``InternalTopics.replicated``): the runtime owns only the partitions of the topic
this broker leads (``owned``; None = every partition, the single broker). Requests for a key of
another partition are answered NOT_COORDINATOR (:meth:`CoordinatorRuntime.owner_error`), and
while a load runs COORDINATOR_LOAD_IN_PROGRESS. Appends become acks=all
(``InternalTopics.append_replicated``: awaited until the ISR has it), so every operation -- its
coordinator call, its writes and their completions -- runs under one asyncio lock
(:meth:`CoordinatorRuntime.execute`, :meth:`CoordinatorRuntime.call`): nothing interleaves
between an append and its completion, as with synchronous storage. When the led set changes,
:meth:`CoordinatorRuntime.reload` unloads and replays every owned partition under that lock (a
simple first form: one coordinator object for all owned partitions, reloaded as a whole; the
coordinator contract, :mod:`exactly.coordinator.shard`, does not change).

Everything runs on the broker's one event loop; the coordinator is never entered concurrently.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from kio.schema.errors import ErrorCode

from exactly.coordinator.result import CoordinatorResult, RequestToken
from exactly.coordinator.shard import CoordinatorShard
from exactly.records.control import ControlType
from exactly.server.clock import now_ms
from exactly.server.coordinator_writes import Answers, ResultDriver, SideEffect

if TYPE_CHECKING:
    from exactly.server.internal_topics import InternalTopics

R = TypeVar("R")

# The timer loop's longest sleep. Every result the runtime carries out (``drive``,
# ``_drive_replicated``: requests, loads, unloads, polls) wakes the loop when it armed a timer
# earlier than the one it sleeps towards (``_maybe_wake``), so the loop sleeps until its next
# deadline; this bound only limits how late a timer armed some other way could fire. It was
# 0.1 s, a poll of a shard with nothing due ten times a second per broker (rf3hop-s21).
IDLE_POLL_S = 1.0
POLL_RETRY_S = 0.1  # after a poll that raised


@dataclass(frozen=True, slots=True)
class LoadStats:
    """What one load replayed: batches (markers included) and key/value records."""

    batches: int
    records: int


@dataclass(frozen=True, slots=True)
class _Periodic:
    name: str
    interval_s: float
    job: Callable[[], object]


class CoordinatorRuntime:
    """Drives one coordinator over one internal topic.

    Owns: the coordinator it drives (``shard``), the ``loaded`` flag, the requests waiting for an
    answer (by token), the registered periodic jobs and the timer wake-up. Lifecycle:
    constructed without I/O -> :meth:`load` (replay; until it ends ``loaded`` is False and the
    bindings answer COORDINATOR_LOAD_IN_PROGRESS) -> :meth:`start_tasks` once the event loop runs
    (timer loop + periodic jobs; the broker cancels the tasks at shutdown). :meth:`unload` and a
    new :meth:`load` may follow each other (not used by a single broker, which always leads).

    ``side_effect`` executes a result's ``effects`` (the transaction markers) and returns the
    coordinator's follow-up result, or None when the effect was deferred (queued for a retry).
    ``skip_bad_records`` logs and skips a record whose replay raises instead of failing the load.
    """

    def __init__(
        self,
        name: str,
        topic: str,
        internal: InternalTopics,
        shard: CoordinatorShard,
        *,
        side_effect: SideEffect | None = None,
        skip_bad_records: bool = False,
        timers: bool = True,
    ) -> None:
        self.name = name
        # False: the shard keeps no timers (``next_deadline`` is always None, ``poll`` does
        # nothing), so no timer task runs: it would only wake the loop every IDLE_POLL_S to poll
        # nothing (the transaction coordinator's 10 wake-ups a second per broker, rf3hop-s21).
        self.timers = timers
        self.topic = topic
        self.internal = internal
        self.shard = shard
        self.loaded = False
        self._skip_bad_records = skip_bad_records
        self._log = logging.getLogger(f"exactly.{name}")
        self._driver = ResultDriver(name, topic, internal, side_effect, self._log)
        self._tokens = itertools.count()
        self._waiting: dict[RequestToken, Callable[[Any], None]] = {}
        self._periodic: list[_Periodic] = []
        self._wake: asyncio.Event | None = None
        self._sleep_until: int | None = None  # when the timer loop wakes next (ms), if sleeping
        # Cluster mode: the partitions this broker leads (None: all), one operation at a time.
        self.replicated = internal.replicated
        self.owned: frozenset[int] | None = frozenset() if self.replicated else None
        self._terms: dict[int, object] = {}  # the leadership of each owned partition at its load
        self._lock = asyncio.Lock()
        self._calls: set[asyncio.Task[Any]] = set()

    # ---- lifecycle ----------------------------------------------------------------------------
    def owner_error(self, partition: int) -> ErrorCode:
        """What a request for a key of ``partition`` gets before reaching the coordinator:
        NOT_COORDINATOR when this broker does not lead it, COORDINATOR_LOAD_IN_PROGRESS while
        loading, else NONE."""
        if self.owned is not None and partition not in self.owned:
            return ErrorCode.not_coordinator
        return ErrorCode.none if self.loaded else ErrorCode.coordinator_load_in_progress

    def load(self) -> LoadStats:
        """Replay every batch of the topic in log order, then drive ``load_complete``."""
        stats = self._replay()
        self.drive(self.shard.load_complete(now_ms()))
        self.loaded = True
        return stats

    async def reload(
        self,
        target: Callable[[], Mapping[int, object]],
        on_change: Callable[[frozenset[int]], None] | None = None,
    ) -> LoadStats | None:
        """Cluster mode: follow the led partitions. Under the operation lock (after the
        operation in flight) ``target()`` says which partitions are led now -- read then, so
        reloads queued behind each other all converge on the newest set. It maps each one to its
        *leadership* (any object whose identity stands for one continuous leadership: the
        replica manager's ``LeaderPartition``). The state is reloaded when the set differs from
        ``owned`` or when a partition's leadership is another one than at the last load: this
        broker lost the partition and led it again between two reloads (the reload that would
        have unloaded it ran after it came back), so what it holds in memory misses whatever the
        leader in between wrote, and its coordinator epoch is stale. An epoch bump of the same
        leadership does not reload (Kafka's ``onElection`` is not called for it). On a change:
        unload, call ``on_change(new set)``, replay the new set (if any) and drive
        ``load_complete``. ``on_change`` must begin the shard's load of that set (both
        coordinators' ``begin_load``): their unload resigns (NOT_COORDINATOR meanwhile, as Kafka
        answers for a partition it does not own), and a resigned coordinator completes only a
        load it began. Returns what was replayed, or None when nothing changed."""
        async with self._lock:
            terms = dict(target())
            owned = frozenset(terms)
            if owned == self.owned and all(terms[p] is self._terms.get(p) for p in owned):
                return None
            if self.loaded:
                self.loaded = False
                await self._drive_replicated(self.shard.unload(now_ms()))
            self.owned = owned
            self._terms = terms
            if on_change is not None:
                on_change(owned)
            if not owned:
                # ``on_change`` may have begun a load of nothing (the coordinators' begin_load);
                # end it, so its views over every partition (ListTransactions) answer an empty
                # list, as on a broker that never led one, and not COORDINATOR_LOAD_IN_PROGRESS
                # for good. (The unload itself resigned: NOT_COORDINATOR meanwhile.)
                await self._drive_replicated(self.shard.load_complete(now_ms()))
                return LoadStats(0, 0)
            stats = self._replay()
            await self._drive_replicated(self.shard.load_complete(now_ms()))
            self.loaded = True
            return stats

    def _replay(self) -> LoadStats:
        replay = self.shard.replay
        end_transaction = self.shard.replay_end_transaction
        commit = ControlType.COMMIT
        batches = records = 0
        for batch in self.internal.replay(self.topic, self.owned):
            batches += 1
            control = batch.control
            if control is not None:
                end_transaction(batch.producer_id, control is commit, batch.partition)
                continue
            # Only transactional batches (TxnOffsetCommit) are pending; idempotent ones are plain.
            producer_id = batch.producer_id if batch.is_transactional else -1
            for offset, key, value in batch.records:
                if key is None:
                    continue
                records += 1
                try:
                    replay(key, value, offset=offset, producer_id=producer_id)
                except Exception:
                    if not self._skip_bad_records:
                        raise
                    # one undecodable record must not keep the broker down
                    self._log.exception(
                        "skipping undecodable record at %s-%d offset %d", self.topic, batch.partition, offset
                    )
        return LoadStats(batches, records)

    def unload(self) -> None:
        """Stop serving (leadership of the topic lost): ``loaded`` turns False and the coordinator
        answers its parked requests and forgets its state. :meth:`load` may follow."""
        self.loaded = False
        self.drive(self.shard.unload(now_ms()))

    def every(self, name: str, interval_s: float, job: Callable[[], object]) -> None:
        """Run ``job`` every ``interval_s`` seconds (first run one interval after start)."""
        self._periodic.append(_Periodic(name, interval_s, job))

    def start_tasks(self) -> list[asyncio.Task[None]]:
        self._wake = asyncio.Event()
        tasks = [asyncio.create_task(self._timer_loop(), name=f"{self.name}-timers")] if self.timers else []
        tasks += [asyncio.create_task(self._periodic_loop(p), name=p.name) for p in self._periodic]
        return tasks

    # ---- operations ---------------------------------------------------------------------------
    def call(self, op: Callable[[RequestToken], CoordinatorResult[R]]) -> asyncio.Future[R]:
        """Run ``op(token)`` (a coordinator request); the future resolves with its answer, which
        may come only from a later operation (a JoinGroup parked for a rebalance)."""
        fut: asyncio.Future[R] = asyncio.get_running_loop().create_future()

        def answer(response: R) -> None:
            if not fut.done():  # the waiting connection may have gone away
                fut.set_result(response)

        if self.replicated:
            task = asyncio.get_running_loop().create_task(self._call_replicated(op, answer, fut))
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)
        else:
            self._run(op, answer)
        return fut

    async def _call_replicated(
        self,
        op: Callable[[RequestToken], CoordinatorResult[R]],
        answer: Callable[[R], None],
        fut: asyncio.Future[R],
    ) -> None:
        try:
            async with self._lock:
                token = next(self._tokens)
                self._waiting[token] = answer
                try:
                    response = await self._drive_replicated(op(token))
                except BaseException:
                    self._waiting.pop(token, None)
                    raise
                if response is not None:
                    self._deliver(token, response)
                self._maybe_wake()
        except Exception as exc:  # the request's handler sees it, as with a synchronous drive
            if not fut.done():
                fut.set_exception(exc)

    async def execute(self, op: Callable[[], CoordinatorResult[R]]) -> R | None:
        """Run ``op()`` and carry out its result; returns the answer (None if it has none). On a
        single broker this is :meth:`drive`; in cluster mode the operation runs under the lock
        and its writes are awaited until the ISR has them."""
        if not self.replicated:
            return self.drive(op())
        return await self._detached(self._execute_locked(op))

    async def _execute_locked(self, op: Callable[[], CoordinatorResult[R]]) -> R | None:
        async with self._lock:
            response = await self._drive_replicated(op())
            self._maybe_wake()
            return response

    async def run_async(self, op: Callable[[RequestToken], CoordinatorResult[R]]) -> R | None:
        """:meth:`run` for either mode (cluster mode: under the lock, writes acknowledged)."""
        if not self.replicated:
            return self.run(op)
        return await self._detached(self._run_locked(op))

    async def _run_locked(self, op: Callable[[RequestToken], CoordinatorResult[R]]) -> R | None:
        answers: list[R] = []
        async with self._lock:
            token = next(self._tokens)
            self._waiting[token] = answers.append
            try:
                response = await self._drive_replicated(op(token))
                if response is not None:
                    self._deliver(token, response)
            finally:
                self._waiting.pop(token, None)
        return answers[0] if answers else None

    async def _detached(self, work: Coroutine[Any, Any, R]) -> R:
        """Run ``work`` (an operation, once started) to its end even if the caller is cancelled:
        a request handler is cancelled when its client disconnects, and an operation cut between
        its append and its completion would leave the coordinator's state half-applied (a
        transactional id's pending transition set for good: CONCURRENT_TRANSACTIONS forever, a
        Prepare* whose markers are never sent), while the record itself may well be replicated.
        Kafka runs the completion whatever became of the connection; so does this: the task
        finishes and its answer is dropped."""
        task = asyncio.get_running_loop().create_task(work)
        self._calls.add(task)
        task.add_done_callback(self._finished_detached)
        return await asyncio.shield(task)

    def _finished_detached(self, task: asyncio.Task[Any]) -> None:
        self._calls.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # seen by the caller too, unless it went away: then this is the only trace
            self._log.info("operation ended with %r", task.exception())

    async def _drive_replicated(self, result: CoordinatorResult[R]) -> R | None:
        """:meth:`drive` with acks=all appends; the caller holds the lock."""
        try:
            return self._answer(await self._driver.drive_replicated(result))  # type: ignore[no-any-return]
        finally:
            self._maybe_wake()

    def run(self, op: Callable[[RequestToken], CoordinatorResult[R]]) -> R | None:
        """Like :meth:`call` for an operation answered before it returns (None if it was not)."""
        answers: list[R] = []
        token = self._run(op, answers.append)
        self._waiting.pop(token, None)  # not answered now: nobody would wait for it later
        return answers[0] if answers else None

    def _run(
        self, op: Callable[[RequestToken], CoordinatorResult[R]], answer: Callable[[R], None]
    ) -> RequestToken:
        token = next(self._tokens)
        self._waiting[token] = answer
        try:
            response = self.drive(op(token))
        except BaseException:
            self._waiting.pop(token, None)
            raise
        if response is not None:
            self._deliver(token, response)
        self._maybe_wake()
        return token

    def drive(self, result: CoordinatorResult[R]) -> R | None:
        """Carry out ``result`` (see the module docstring); returns the answer of the request that
        produced it, or None when it has none yet. Parked requests' replies are delivered."""
        try:
            return self._answer(self._driver.drive(result))  # type: ignore[no-any-return]
        finally:
            self._maybe_wake()  # a timer it armed may be due before the loop would wake

    def _answer(self, answers: Answers) -> Any:
        for reply in answers.replies:
            self._deliver(reply.token, reply.response)
        return answers.response

    def _deliver(self, token: RequestToken, response: Any) -> None:
        answer = self._waiting.pop(token, None)
        if answer is not None:
            answer(response)

    # ---- time ---------------------------------------------------------------------------------
    def _maybe_wake(self) -> None:
        """A result just carried out may have armed a timer earlier than the one the loop
        sleeps towards (called after every one: ``drive``, ``_drive_replicated``)."""
        if self._wake is None or self._sleep_until is None:
            return
        deadline = self.shard.next_deadline()
        if deadline is not None and deadline < self._sleep_until:
            self._wake.set()

    async def _timer_loop(self) -> None:
        wake = self._wake
        assert wake is not None
        loop = asyncio.get_running_loop()
        while True:
            now = now_ms()
            deadline = self.shard.next_deadline()
            delay_ms = (
                IDLE_POLL_S * 1000 if deadline is None else min(max(deadline - now, 0), IDLE_POLL_S * 1000)
            )
            self._sleep_until = now + int(delay_ms)
            if delay_ms > 0:
                # the deadline sets the event a request arming an earlier timer sets; no wait_for
                # (its task, timeout and cancellation per poll were most of an idle broker's CPU)
                wake.clear()
                timer = loop.call_later(delay_ms / 1000, wake.set)
                try:
                    await wake.wait()
                finally:
                    timer.cancel()
            self._sleep_until = None
            try:
                await self.execute(lambda: self.shard.poll(now_ms()))
            except Exception:  # a bug in one timer must not stop every timer
                self._log.exception("%s coordinator poll failed", self.name)
                await asyncio.sleep(POLL_RETRY_S)

    async def _periodic_loop(self, job: _Periodic) -> None:
        while True:
            await asyncio.sleep(job.interval_s)
            try:
                outcome = job.job()
                if inspect.isawaitable(outcome):
                    await outcome
            except Exception:  # one bad run must not stop the job for good
                self._log.exception("%s failed", job.name)
