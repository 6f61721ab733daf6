"""The transaction coordinator's binding to the coordinator runtime: its configuration, the
COMMIT/ABORT markers it writes, its periodic scans and its coordinator epoch.

Theory of operation
-------------------
The :class:`~exactly.server.coordinator_runtime.CoordinatorRuntime` appends the coordinator's
``__transaction_state`` writes and completes them; the one effect it cannot carry out itself is
:class:`~exactly.coordinator.txn.effects.WriteMarkers`, which :meth:`TxnRuntime._markers`
handles: write the COMMIT/ABORT control batch to every partition of the transaction, tell the
group coordinator when one lands on ``__consumer_offsets``, then hand back
``on_markers_written``'s result -- the CompleteCommit/CompleteAbort write.

A transaction's markers are written as soon as its PrepareCommit/PrepareAbort record is durable,
in the same drive, so the EndTxn answer is delivered only after the markers and the Complete*
record are written. Kafka answers once PrepareCommit is durable and writes markers in the
background; writing them first costs one local append per partition and means a client that saw
its commit succeed can read it under read_committed at once, and never meets
CONCURRENT_TRANSACTIONS on its next transaction. A marker set that cannot be written (a storage
error) is queued and retried every second (EndTxn is still answered: the decision is durable);
the transactional.id stays blocked (CONCURRENT_TRANSACTIONS) until its markers and Complete*
record are durable, and after a crash ``load_complete`` hands the unfinished ones back, so every
decided transaction completes.

The coordinator epoch is persisted (``txn-coordinator-epoch``) and bumped at every start, so
markers of a previous incarnation can be told apart (TRANSACTION_COORDINATOR_FENCED).

Cluster mode differs in three ways. Ownership: nothing is loaded at start-up; the replica
manager calls :meth:`TxnRuntime.on_leadership` with the ``__transaction_state`` partitions this
broker leads and their leader epochs, the runtime reloads them, and requests for other
transactional ids get NOT_COORDINATOR (:meth:`TxnRuntime.owner_error`). The coordinator epoch of
a transaction's markers is its partition's leader epoch at load time (no epoch file). Markers
are sent by :class:`~exactly.server.txn_marker_sender.TxnMarkerSender` in a background task per
transaction, to each partition's current leader, and EndTxn is answered once PrepareCommit /
PrepareAbort is acknowledged by the ISR (Kafka's order: the client's next transaction meets
CONCURRENT_TRANSACTIONS until Complete* is written, and retries). A reload cancels the marker
tasks; the new load hands every Prepare* back (``load_complete``), so the markers are re-sent.

``EXACTLY_FAULT=crash-after-prepare`` (tests only) kills the process with SIGKILL right after a
PrepareCommit/PrepareAbort is durable and before any marker: the coordinator-crash scenario. It
never fires while start-up completes the transactions a previous crash left in Prepare*, so a
restart with the variable still set recovers instead of dying again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from kio.schema.errors import ErrorCode

from exactly.coordinator.result import CoordinatorResult
from exactly.coordinator.txn.config import TxnCoordinatorConfig
from exactly.coordinator.txn.coordinator import TransactionCoordinator
from exactly.coordinator.txn.effects import WriteMarkers
from exactly.coordinator.txn.state import TransactionState
from exactly.records.control import ControlType
from exactly.server.clock import now_ms
from exactly.server.coordinator_runtime import CoordinatorRuntime
from exactly.server.internal_topics import AppendFailed
from exactly.server.txn_marker_sender import TxnMarkerSender
from exactly.storage.durable import write_durably
from exactly.topics import CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC

if TYPE_CHECKING:
    from exactly.server.broker import Broker

log = logging.getLogger("exactly.txn")

R = TypeVar("R")


class Leadership(Protocol):
    """One continuous leadership of a ``__transaction_state`` partition by this broker (the
    replica manager's ``LeaderPartition``): its identity, and its current leader epoch."""

    @property
    def leader_epoch(self) -> int: ...


MARKER_RETRY_S = 1.0
_COMPLETING = (TransactionState.COMPLETE_COMMIT, TransactionState.COMPLETE_ABORT)
# Marker errors after which retrying cannot help: the partition moved on past this transaction.
_SKIP_MARKER_ERRORS = {
    ErrorCode.invalid_producer_epoch,
    ErrorCode.producer_fenced,
    ErrorCode.transaction_coordinator_fenced,
    ErrorCode.unknown_topic_or_partition,
}


class TxnRuntime:
    """The transaction coordinator, its runtime and what only transactions need.

    Owns: the :class:`TransactionCoordinator`, the :class:`CoordinatorRuntime` driving it over
    ``__transaction_state``, the marker sets waiting for a retry, and the coordinator epoch file.
    Lifecycle: constructed by the broker (no I/O) -> :meth:`load` (bump the epoch, replay, send
    the markers owed by a previous crash) -> :meth:`start_tasks` (timer loop, transaction
    timeouts, transactional.id expiration, marker retries; cancelled by the broker at shutdown).
    """

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        cfg = broker.config
        self.config = TxnCoordinatorConfig(
            transaction_max_timeout_ms=cfg.get_int("transaction.max.timeout.ms"),
            two_phase_commit_enable=cfg.get_bool("transaction.two.phase.commit.enable"),
            transactional_id_expiration_ms=cfg.get_int("transactional.id.expiration.ms"),
            transaction_state_partitions=cfg.get_int("transaction.state.log.num.partitions"),
            offsets_topic_partitions=cfg.get_int("offsets.topic.num.partitions"),
            abort_timed_out_interval_ms=cfg.get_int(
                "transaction.abort.timed.out.transaction.cleanup.interval.ms"
            ),
            remove_expired_transactional_ids_interval_ms=cfg.get_int(
                "transaction.remove.expired.transaction.cleanup.interval.ms"
            ),
        )
        self.coordinator = TransactionCoordinator(broker.producer_ids.generate, config=self.config)
        self.runtime = CoordinatorRuntime(
            "txn",
            TRANSACTION_STATE_TOPIC,
            broker.internal,
            self.coordinator,
            side_effect=self._markers,
            timers=False,  # its timeouts and expiry are periodic scans (``every`` below)
        )
        coord = self.coordinator
        self.runtime.every(
            "txn-timeouts", self.config.abort_timed_out_interval_ms / 1000, self._abort_timed_out
        )
        self.runtime.every(
            "txn-id-expiration",
            self.config.remove_expired_transactional_ids_interval_ms / 1000,
            lambda: self.runtime.execute(lambda: coord.expire_transactional_ids(now_ms())),
        )
        self.runtime.every("txn-marker-retry", MARKER_RETRY_S, self._retry_markers)
        self._epoch_file = broker.data_dir / "txn-coordinator-epoch"
        self._pending_markers: list[WriteMarkers] = []
        self._fault = os.environ.get("EXACTLY_FAULT", "")
        self._loaded = False  # the fault never fires while load() completes owed transactions
        self._owed_at_load = 0
        # Cluster mode: leader epochs of the led partitions at load, the marker tasks of this
        # load (cancelled by the next one) and the load's generation.
        self.marker_sender = TxnMarkerSender(broker)
        self._partition_epochs: dict[int, int] = {}
        self._marker_tasks: set[asyncio.Task[None]] = set()
        self._generation = 0

    # ---- lifecycle --------------------------------------------------------------------------
    def load(self) -> None:
        if self.runtime.replicated:
            self._loaded = True  # cluster mode: loads follow leadership (on_leadership)
            return
        epoch = _bump_epoch(self._epoch_file)
        self.coordinator.begin_load(epoch)
        stats = self.runtime.load()
        log.info(
            "transaction coordinator loaded %d records (epoch %d); %d transactions to complete",
            stats.records,
            epoch,
            self._owed_at_load,
        )
        self._loaded = True

    def start_tasks(self) -> list[asyncio.Task[None]]:
        return self.runtime.start_tasks()

    async def stop(self) -> None:
        """At shutdown: stop sending markers (cluster mode; the next coordinator re-sends)."""
        tasks = list(self._marker_tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.marker_sender.close()

    async def on_leadership(self, led: Callable[[], Mapping[int, Leadership]]) -> None:
        """Cluster mode: the ``__transaction_state`` partitions this broker leads may have
        changed; ``led()`` maps each one it leads now to its leadership (read under the
        runtime's lock), whose leader epoch then is the coordinator epoch of its markers.
        Reload when the set or a leadership changed (an epoch bump of the same leadership does
        not reload, as Kafka's ``onElection`` is not called then)."""
        epochs: dict[int, int] = {}

        def target() -> Mapping[int, Leadership]:
            leaderships = led()
            epochs.clear()
            epochs.update({p: lp.leader_epoch for p, lp in leaderships.items()})
            return leaderships

        def changed(owned: frozenset[int]) -> None:
            for task in list(self._marker_tasks):
                task.cancel()
            self._generation += 1
            self._partition_epochs = dict(epochs)
            self._owed_at_load = 0
            # The coordinator's own epoch only tells its stale appends apart; markers carry the
            # partition's leader epoch (``_send_markers``).
            # ``owned``: ids of other partitions get NOT_COORDINATOR from the coordinator itself,
            # also a request that passed ``owner_error`` before this reload took the lock.
            self.coordinator.begin_load(max(epochs.values(), default=0), partitions=owned)

        stats = await self.runtime.reload(target, changed)
        if stats is None:
            return
        log.info(
            "transaction coordinator for %s partitions %s (leader epochs %s): %d records loaded; "
            "%d transactions to complete",
            TRANSACTION_STATE_TOPIC,
            sorted(epochs),
            dict(sorted(epochs.items())),
            stats.records,
            self._owed_at_load,
        )

    def owner_error(self, transactional_id: str) -> ErrorCode:
        """What a request for ``transactional_id`` gets before reaching the coordinator:
        NOT_COORDINATOR (another broker leads its partition), COORDINATOR_LOAD_IN_PROGRESS, or
        NONE. The coordinator itself answers LOAD_IN_PROGRESS while loading too."""
        return self.runtime.owner_error(self.coordinator.partition_for(transactional_id))

    # ---- driving ----------------------------------------------------------------------------
    def drive(self, result: CoordinatorResult[R]) -> R:
        """Carry out the result of a client request; returns its response (single broker).

        The transaction coordinator never parks a request and storage is synchronous, so a
        request's response is known once its writes are driven.
        """
        return cast(R, self.runtime.drive(result))

    async def execute(self, op: Callable[[], CoordinatorResult[R]]) -> R:
        """Run a client request ``op()`` and carry out its result; returns its response (in
        cluster mode once its writes are acknowledged by the ISR)."""
        return cast(R, await self.runtime.execute(op))

    def _markers(self, effect: object) -> CoordinatorResult[Any] | None:
        """The runtime's side-effect handler: write one transaction's markers."""
        assert isinstance(effect, WriteMarkers), effect
        if not self._loaded or (self.runtime.replicated and not self.runtime.loaded):
            self._owed_at_load += 1
        elif self._fault == "crash-after-prepare":
            log.error("EXACTLY_FAULT=crash-after-prepare: killing the broker before markers")
            os.kill(os.getpid(), signal.SIGKILL)
        if self.runtime.replicated:
            task = asyncio.get_running_loop().create_task(
                self._send_markers(effect, self._generation), name=f"txn-markers-{effect.transactional_id}"
            )
            self._marker_tasks.add(task)
            task.add_done_callback(self._marker_tasks.discard)
            return None
        if not self._write_markers(effect):
            self._pending_markers.append(effect)
            return None
        return self.coordinator.on_markers_written(
            effect.transactional_id, effect.producer_id, effect.producer_epoch, effect.result
        )

    def _write_markers(self, markers: WriteMarkers) -> bool:
        """Write the marker to every partition; False when one failed and must be retried."""
        internal = self.broker.internal
        commit = markers.result is ControlType.COMMIT
        ok = True
        for tp in sorted(markers.partitions, key=lambda t: (t.topic, t.partition)):
            try:
                written = internal.write_marker(
                    tp, markers.result, markers.producer_id, markers.producer_epoch, markers.coordinator_epoch
                )
            except AppendFailed as exc:
                if exc.error_code in _SKIP_MARKER_ERRORS:
                    log.warning("marker for %s on %s skipped: %s", markers.transactional_id, tp, exc)
                    continue
                log.error("marker for %s on %s failed, will retry: %s", markers.transactional_id, tp, exc)
                ok = False
                continue
            if written and tp.topic == CONSUMER_OFFSETS_TOPIC:
                self.broker.groups.on_marker(tp.partition, markers.producer_id, commit)
        return ok

    async def _send_markers(self, markers: WriteMarkers, generation: int) -> None:
        """Cluster mode: send the markers, then persist Complete* (retried while its append
        fails). Cancelled by a reload; the new load re-sends what is still in Prepare*."""
        partition = self.coordinator.partition_for(markers.transactional_id)
        epoch = self._partition_epochs.get(partition)
        if epoch is None:
            return
        try:
            await self.marker_sender.send(markers, epoch)
            tid = markers.transactional_id
            while generation == self._generation:
                await self.runtime.execute(
                    lambda: self.coordinator.on_markers_written(
                        tid, markers.producer_id, markers.producer_epoch, markers.result
                    )
                )
                if self.coordinator.pending_state(tid) not in _COMPLETING:
                    return
                await asyncio.sleep(MARKER_RETRY_S)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("completing %s failed", markers.transactional_id)

    async def _abort_timed_out(self) -> None:
        def expire() -> CoordinatorResult[Any]:
            result = self.coordinator.expire_timed_out(now_ms())
            for write in result.writes:
                log.info("aborting timed-out transaction (%s)", write.describe)
            return result

        await self.runtime.execute(expire)

    def _retry_markers(self) -> None:
        pending, self._pending_markers = self._pending_markers, []
        for markers in pending:
            try:
                self.drive(CoordinatorResult(effects=(markers,)))
            except Exception:
                log.exception("marker retry failed")
                self._pending_markers.append(markers)


def _bump_epoch(path: Path) -> int:
    """Read, increment and durably write the coordinator epoch."""
    try:
        epoch = int(path.read_text().strip()) + 1
    except (FileNotFoundError, ValueError):
        epoch = 0
    write_durably(path, f"{epoch}\n".encode())  # the directory fsync keeps it from rolling back
    return epoch
