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
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from kio.schema.errors import ErrorCode

from exactly.coordinator.result import CoordinatorResult
from exactly.coordinator.txn.config import TxnCoordinatorConfig
from exactly.coordinator.txn.coordinator import TransactionCoordinator
from exactly.coordinator.txn.effects import WriteMarkers
from exactly.records.control import ControlType
from exactly.server.clock import now_ms
from exactly.server.coordinator_runtime import CoordinatorRuntime
from exactly.server.internal_topics import AppendFailed
from exactly.storage.durable import write_durably
from exactly.topics import CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC

if TYPE_CHECKING:
    from exactly.server.broker import Broker

log = logging.getLogger("exactly.txn")

R = TypeVar("R")

MARKER_RETRY_S = 1.0
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
            transactional_id_expiration_ms=cfg.get_int("transactional.id.expiration.ms"),
            transaction_state_partitions=cfg.get_int("transaction.state.log.num.partitions"),
            offsets_topic_partitions=cfg.get_int("offsets.topic.num.partitions"),
            abort_timed_out_interval_ms=cfg.get_int(
                "transaction.abort.timed.out.transaction.cleanup.interval.ms"
            ),
        )
        self.coordinator = TransactionCoordinator(broker.producer_ids.generate, config=self.config)
        self.runtime = CoordinatorRuntime(
            "txn", TRANSACTION_STATE_TOPIC, broker.internal, self.coordinator, side_effect=self._markers
        )
        coord = self.coordinator
        self.runtime.every(
            "txn-timeouts", self.config.abort_timed_out_interval_ms / 1000, self._abort_timed_out
        )
        self.runtime.every(
            "txn-id-expiration",
            self.config.remove_expired_transactional_ids_interval_ms / 1000,
            lambda: self.runtime.drive(coord.expire_transactional_ids(now_ms())),
        )
        self.runtime.every("txn-marker-retry", MARKER_RETRY_S, self._retry_markers)
        self._epoch_file = broker.data_dir / "txn-coordinator-epoch"
        self._pending_markers: list[WriteMarkers] = []
        self._fault = os.environ.get("EXACTLY_FAULT", "")
        self._loaded = False  # the fault never fires while load() completes owed transactions
        self._owed_at_load = 0

    # ---- lifecycle --------------------------------------------------------------------------
    def load(self) -> None:
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

    # ---- driving ----------------------------------------------------------------------------
    def drive(self, result: CoordinatorResult[R]) -> R:
        """Carry out the result of a client request; returns its response.

        The transaction coordinator never parks a request and storage is synchronous, so a
        request's response is known once its writes are driven.
        """
        return cast(R, self.runtime.drive(result))

    def _markers(self, effect: object) -> CoordinatorResult[Any] | None:
        """The runtime's side-effect handler: write one transaction's markers."""
        assert isinstance(effect, WriteMarkers), effect
        if not self._loaded:
            self._owed_at_load += 1
        if self._fault == "crash-after-prepare" and self._loaded:
            log.error("EXACTLY_FAULT=crash-after-prepare: killing the broker before markers")
            os.kill(os.getpid(), signal.SIGKILL)
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

    def _abort_timed_out(self) -> None:
        result = self.coordinator.expire_timed_out(now_ms())
        for write in result.writes:
            log.info("aborting timed-out transaction (%s)", write.describe)
        self.runtime.drive(result)

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
