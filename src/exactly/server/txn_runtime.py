"""The shell around the sans-IO TransactionCoordinator: executes its effects, writes markers,
runs its timers.

Theory of operation
-------------------
The coordinator returns ``Step(response, effects)``. ``drive`` executes effects in order:

* ``AppendTxnLog`` -> append the record to ``__transaction_state-<p>`` (synchronous storage; an
  append has either succeeded or raised when the call returns) and report it with
  ``on_log_append_done``, whose step may carry the client's answer and more effects.
* ``WriteMarkers`` -> write the COMMIT/ABORT control batch to every partition of the
  transaction, tell the group coordinator when one lands on ``__consumer_offsets``, then
  ``on_markers_written`` yields the CompleteCommit/CompleteAbort append.

Markers are written inline, before EndTxn is answered. Kafka answers once PrepareCommit is
durable and writes markers in the background; writing them first costs one local append per
partition and means a client that saw its commit succeed can read it under read_committed at
once, and never meets CONCURRENT_TRANSACTIONS on its next transaction. A marker set that cannot
be written (a storage error) is queued and retried every second; the transactional.id stays
blocked (CONCURRENT_TRANSACTIONS) until its markers and Complete* record are durable, and after a
crash ``end_load`` hands the unfinished ones back, so every decided transaction completes.

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
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.coordinator.txn.config import TxnCoordinatorConfig
from exactly.coordinator.txn.coordinator import TransactionCoordinator
from exactly.coordinator.txn.effects import AppendTxnLog, Step, WriteMarkers
from exactly.records.control import ControlType
from exactly.server.clock import now_ms
from exactly.server.internal_topics import OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC, AppendFailed

if TYPE_CHECKING:
    from exactly.server.broker import Broker

log = logging.getLogger("exactly.txn")

MARKER_RETRY_S = 1.0
# Marker errors after which retrying cannot help: the partition moved on past this transaction.
_SKIP_MARKER_ERRORS = {
    ErrorCode.invalid_producer_epoch,
    ErrorCode.producer_fenced,
    ErrorCode.transaction_coordinator_fenced,
    ErrorCode.unknown_topic_or_partition,
}


class TxnRuntime:
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
        self._epoch_file = broker.data_dir / "txn-coordinator-epoch"
        self._pending_markers: list[WriteMarkers] = []
        self._fault = os.environ.get("EXACTLY_FAULT", "")
        self._loaded = False  # the fault never fires while load() completes owed transactions

    # ---- lifecycle --------------------------------------------------------------------------
    def load(self) -> None:
        epoch = _bump_epoch(self._epoch_file)
        coord = self.coordinator
        coord.begin_load(epoch)
        records = 0
        for batch in self.broker.internal.replay(TRANSACTION_STATE_TOPIC):
            for _offset, key, value in batch.records:
                if key is not None:
                    coord.replay(key, value)
                    records += 1
        owed = coord.end_load(now_ms())
        log.info(
            "transaction coordinator loaded %d records (epoch %d); %d transactions to complete",
            records,
            epoch,
            len(owed),
        )
        for markers in owed:
            self.drive(Step(None, (markers,)))
        self._loaded = True

    def start_tasks(self) -> list[asyncio.Task[None]]:
        return [
            asyncio.create_task(self._timeout_loop(), name="txn-timeouts"),
            asyncio.create_task(self._marker_retry_loop(), name="txn-marker-retry"),
            asyncio.create_task(self._expiration_loop(), name="txn-id-expiration"),
        ]

    # ---- driving ----------------------------------------------------------------------------
    def drive(self, step: Step[Any]) -> Any:
        """Execute ``step``'s effects (and those they lead to); return the client's response."""
        response = step.response
        effects = list(step.effects)
        coord = self.coordinator
        while effects:
            effect = effects.pop(0)
            if isinstance(effect, AppendTxnLog):
                error = ErrorCode.none
                try:
                    self.broker.internal.append(
                        TRANSACTION_STATE_TOPIC, effect.partition, [(effect.key, effect.value)]
                    )
                except AppendFailed as exc:
                    log.warning("__transaction_state append for %s failed: %s", effect.transactional_id, exc)
                    error = exc.error_code
                nxt = coord.on_log_append_done(effect, error, now_ms=now_ms())
                if nxt.response is not None:
                    response = nxt.response
                effects.extend(nxt.effects)
            elif isinstance(effect, WriteMarkers):
                if self._fault == "crash-after-prepare" and self._loaded:
                    log.error("EXACTLY_FAULT=crash-after-prepare: killing the broker before markers")
                    os.kill(os.getpid(), signal.SIGKILL)
                if self._write_markers(effect):
                    nxt = coord.on_markers_written(
                        effect.transactional_id, effect.producer_id, effect.producer_epoch, effect.result
                    )
                    effects.extend(nxt.effects)
                else:
                    self._pending_markers.append(effect)
        return response

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
            if written and tp.topic == OFFSETS_TOPIC:
                self.broker.groups.on_marker(tp.partition, markers.producer_id, commit)
        return ok

    # ---- periodic tasks ---------------------------------------------------------------------
    async def _timeout_loop(self) -> None:
        interval = self.config.abort_timed_out_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                for append in self.coordinator.expire_timed_out(now_ms()):
                    log.info("aborting timed-out transaction %s", append.transactional_id)
                    self.drive(Step(None, (append,)))
            except Exception:
                log.exception("transaction timeout check failed")

    async def _expiration_loop(self) -> None:
        interval = self.config.remove_expired_transactional_ids_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                for append in self.coordinator.expire_transactional_ids(now_ms()):
                    self.drive(Step(None, (append,)))
            except Exception:
                log.exception("transactional id expiration failed")

    async def _marker_retry_loop(self) -> None:
        while True:
            await asyncio.sleep(MARKER_RETRY_S)
            if not self._pending_markers:
                continue
            pending, self._pending_markers = self._pending_markers, []
            for markers in pending:
                try:
                    self.drive(Step(None, (markers,)))
                except Exception:
                    log.exception("marker retry failed")
                    self._pending_markers.append(markers)


def _bump_epoch(path: Path) -> int:
    """Read, increment and durably write the coordinator epoch."""
    try:
        epoch = int(path.read_text().strip()) + 1
    except (FileNotFoundError, ValueError):
        epoch = 0
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        f.write(f"{epoch}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return epoch
