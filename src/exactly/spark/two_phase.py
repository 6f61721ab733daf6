"""Atomic batches: the sink's two-phase commit over KIP-939 (``atomicBatches``).

Per-task mode commits each Spark task's transaction as soon as the task finishes, so a failed job
leaves its finished tasks visible and a micro-batch appears task by task. In two-phase mode every
batch is all-or-nothing across every partition and topic it writes:

1. **Prepare (each task).** The task writes its records and its progress marker in a librdkafka
   transaction, flushes, and does not commit. It then adopts its own transaction through the
   project's wire client (:func:`exactly.client.two_phase.adopt_prepared`: InitProducerId v6 with
   ``enable_2pc`` + ``keep_prepared_txn``). From then on the transaction is a 2PC transaction: the
   broker never aborts it on ``transaction.timeout.ms``, and only the holder of the returned
   (producer id, epoch) -- or an explicit InitProducerId without ``keep_prepared_txn`` -- ends it.
   The task returns (transactional id, producer id, epoch) in its commit message.
2. **Decide (driver, ``commit``).** The driver first appends its decision -- the batch id and
   every prepared transaction -- to the progress topic (key ``<prefix>-<write id>-decision``,
   acks=all), then commits each transaction (EndTxn as holder). A decision is never rewritten:
   a repeated ``commit`` of the same batch finds it and only repeats the (idempotent) EndTxns,
   adding transactions it did not record yet.
3. **Abort (driver, ``abort``).** Unless the batch is already decided (then it is rolled
   forward: committed, never aborted), the prepared transactions of the messages are aborted, and
   then every transaction still open under ``<prefix>-<write id>-`` (a task that prepared and then
   failed for good sent no message).
4. **Recovery.** A driver that dies after its decision and before (all) its commits leaves
   decided, open transactions. Spark replays the batch (its commit log lacks it); each replayed
   task, before ``init_transactions`` (which would abort an open transaction of its id), looks at
   its id: an open 2PC transaction that the latest decision lists is committed first. The task
   then finds its progress marker -- or, when an open transaction on the progress partition hides
   the marker, the decision naming it (:func:`last_committed_batch`) -- and skips, as in per-task
   mode. A driver that died before its decision leaves undecided transactions: the replay's
   ``init_transactions`` aborts them and the batch is written again.

Guarantee: under read_committed every record exactly once; a batch (micro-batch or batch job) is
all-or-nothing; a reader may see part of a batch only during the driver's commit phase (one EndTxn
per task plus the markers), not while tasks run. Kafka never makes one transaction visible on
several partitions at one instant, so that window cannot be zero.

Supported brokers: ``exactly`` with ``transaction.two.phase.commit.enable=true``; Kafka >= 4.1
with 2PC enabled needs the same permission (the TWO_PHASE_COMMIT ACL) and accepts only
transactions started as 2PC for ``keep_prepared_txn`` -- which librdkafka cannot start -- so on
Kafka the option resolves to per-task mode unless forced. A batch *job* whose driver dies after
preparing leaves its 2PC transactions open (nothing replays a job under its random write id):
``exactly txn list --state Ongoing`` shows them and ``exactly txn abort --transactional-id`` ends
them.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from exactly.client.broker_pool import BrokerPool
from exactly.client.two_phase import (
    TWO_PHASE_COMMIT_CONFIG,
    PreparedTxn,
    TwoPhaseError,
    adopt_prepared,
    end_prepared,
    supports_two_phase_commit,
)
from exactly.client.txn_admin import OpsError, describe_one, list_transactions
from exactly.client.wire import WireError
from exactly.spark import progress
from exactly.spark.options import OptionError, SinkOptions

log = logging.getLogger("exactly.spark.two_phase")

TWO_PHASE_COMMIT_TIMEOUT_MS = 2**31 - 1
_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Decision:
    batch: int
    txns: tuple[PreparedTxn, ...]


def _bootstrap(options: SinkOptions) -> str:
    return options.client["bootstrap.servers"]


def resolve_atomic(options: SinkOptions) -> bool:
    """Driver side, once per writer: does this sink run in two-phase mode?"""
    if not options.exactly_once or options.atomic_batches == "false":
        return False
    try:
        with BrokerPool.connect(_bootstrap(options), timeout=30, config=options.client) as pool:
            supported = supports_two_phase_commit(pool)
    except (OSError, WireError):
        supported = False
    if options.atomic_batches == "true" and not supported:
        raise OptionError(
            f"atomicBatches=true, but the broker does not allow two-phase commit ({TWO_PHASE_COMMIT_CONFIG})"
        )
    return supported


# ---------------------------------------------------------------------------- decisions
def _decision_location(options: SinkOptions, write_id: str, partitions: int) -> tuple[str, int]:
    key = progress.decision_key(options.transactional_id_prefix, write_id)
    return key, progress.decision_partition(key, partitions)


def read_decision(options: SinkOptions, write_id: str, partitions: int) -> Decision | None:
    key, partition = _decision_location(options, write_id, partitions)
    found = progress.latest_decision(options.client, options.progress_topic, partition, key)
    if found is None:
        return None
    txns = tuple(PreparedTxn(str(t), int(p), int(e)) for t, p, e in found.value.get("txns", ()))
    return Decision(found.batch, txns)


def record_decision(options: SinkOptions, write_id: str, partitions: int, decision: Decision) -> None:
    key, partition = _decision_location(options, write_id, partitions)
    value = json.dumps(
        {
            "decision": "commit",
            "batch": decision.batch,
            "write_id": write_id,
            "txns": [[t.transactional_id, t.producer_id, t.producer_epoch] for t in decision.txns],
        },
        separators=(",", ":"),
    ).encode()
    progress.write_decision(options.client, options.progress_topic, partition, key, value)


# ---------------------------------------------------------------------------- task side
def resolve_leftover(options: SinkOptions, write_id: str, txn_id: str, partitions: int) -> None:
    """Before ``init_transactions``: commit this id's open transaction if a decision lists it.

    Undecided leftovers are left to ``init_transactions``, which aborts them.
    """
    with BrokerPool.connect(_bootstrap(options), timeout=_TIMEOUT_S, config=options.client) as pool:
        try:
            state = describe_one(pool, txn_id)
        except OpsError:
            return  # never used (or expired): nothing left open
        if (
            state.transaction_state != "Ongoing"
            or state.transaction_timeout_ms != TWO_PHASE_COMMIT_TIMEOUT_MS
        ):
            return
        decision = read_decision(options, write_id, partitions)
        held = PreparedTxn(txn_id, state.producer_id, state.producer_epoch)
        if decision is not None and held in decision.txns:
            log.info(
                "%s: batch %d was decided before the driver stopped; committing it", txn_id, decision.batch
            )
            end_prepared(pool, held, commit=True, timeout_s=_TIMEOUT_S)


def last_committed_batch(
    options: SinkOptions, write_id: str, txn_id: str, marker_partition: int, partitions: int
) -> int | None:
    """After ``init_transactions``: the newest batch ``txn_id`` committed, without waiting for
    other writers' transactions (``progress.last_committed_batch`` would).

    A prepared transaction holds its progress partition's LSO until its driver decides, after
    every task of the batch finished; a task of a later wave (more Spark partitions than progress
    partitions) or of another query whose driver is gone must not wait behind it. So the markers
    are read only up to the LSO; when that is below the high watermark (a committed marker of
    ours may sit above the open transaction), the write's latest decision answers too: it lists
    every transaction committed for its batch (those of ours were committed by
    ``resolve_leftover`` at the latest). Not covered: a batch that a per-task run of the same
    query committed (no decision) with its marker above another writer's open transaction -- a
    query switched from per-task mode to two-phase mode while its driver died after that commit.
    """
    last, whole = progress.last_committed_batch_below_lso(
        options.client, options.progress_topic, marker_partition, txn_id
    )
    if whole:
        return last
    decision = read_decision(options, write_id, partitions)
    if decision is not None and any(t.transactional_id == txn_id for t in decision.txns):
        return decision.batch if last is None else max(last, decision.batch)
    return last


def prepare(options: SinkOptions, txn_id: str) -> PreparedTxn:
    """After the flush: adopt the task's own open transaction as a 2PC transaction."""
    with BrokerPool.connect(_bootstrap(options), timeout=_TIMEOUT_S, config=options.client) as pool:
        adopted = adopt_prepared(pool, txn_id, timeout_s=_TIMEOUT_S)
    if not adopted.kept:
        raise TwoPhaseError(f"{txn_id}: no open transaction to prepare (was it aborted?)")
    return adopted.holder


# ---------------------------------------------------------------------------- driver side
def commit(
    options: SinkOptions, write_id: str, partitions: int, batch: int, prepared: list[PreparedTxn]
) -> None:
    """Record the decision (unless recorded), then commit every transaction it names."""
    decision = read_decision(options, write_id, partitions)
    if decision is not None and decision.batch == batch:
        txns = decision.txns + tuple(t for t in prepared if t not in decision.txns)
        if len(txns) > len(decision.txns):
            record_decision(options, write_id, partitions, Decision(batch, txns))
        recorded_before = set(decision.txns)
    else:
        if not prepared:
            return
        txns = tuple(prepared)
        options.faults.driver_step("before-decision", batch)
        record_decision(options, write_id, partitions, Decision(batch, txns))
        recorded_before = set()
    options.faults.after_decision(batch)
    fresh = not recorded_before
    if fresh:
        options.faults.driver_step("after-decision", batch)
    with BrokerPool.connect(_bootstrap(options), timeout=_TIMEOUT_S, config=options.client) as pool:
        for i, txn in enumerate(txns):
            if i == 1 and fresh:
                options.faults.driver_step("mid-commit", batch)
            try:
                end_prepared(pool, txn, commit=True, timeout_s=_TIMEOUT_S)
            except TwoPhaseError:
                if txn in recorded_before and txn not in prepared:
                    # decided earlier and not prepared again: a replayed task committed it and
                    # moved on (its epoch is newer now)
                    log.info("%s: already completed after the driver restarted", txn.transactional_id)
                    continue
                raise
    log.info("batch %d: committed %d prepared transactions", batch, len(txns))


def abort(
    options: SinkOptions, write_id: str | None, partitions: int, batch: int, prepared: list[PreparedTxn]
) -> None:
    """Abort the batch's transactions -- or roll it forward if it was decided already."""
    if write_id is None:  # no task reported (streaming): the replay's init_transactions cleans up
        return
    decision = read_decision(options, write_id, partitions)
    if decision is not None and decision.batch == batch:
        log.warning("batch %d was decided before the abort: committing it, never aborting", batch)
        commit(options, write_id, partitions, batch, prepared)
        return
    prefix = f"{options.transactional_id_prefix}-{write_id}-"
    with BrokerPool.connect(_bootstrap(options), timeout=_TIMEOUT_S, config=options.client) as pool:
        for txn in prepared:
            try:
                end_prepared(pool, txn, commit=False, timeout_s=_TIMEOUT_S)
            except TwoPhaseError as exc:
                log.warning("abort of %s: %s", txn.transactional_id, exc)
        for listed in list_transactions(pool, states=("Ongoing",)):
            if not listed.transactional_id.startswith(prefix):
                continue
            _abort_open(pool, listed.transactional_id)
    log.info("batch %d: aborted", batch)


def _abort_open(pool: BrokerPool, txn_id: str) -> None:
    """A transaction of this write left open by a task that sent no message: adopt and abort."""
    try:
        adopted = adopt_prepared(pool, txn_id, timeout_s=_TIMEOUT_S)
        if adopted.kept:
            end_prepared(pool, adopted.holder, commit=False, timeout_s=_TIMEOUT_S)
            log.info("%s: aborted the transaction a failed task left open", txn_id)
    except TwoPhaseError as exc:
        log.warning("abort of %s: %s", txn_id, exc)


def prepared_of(messages: list[Any]) -> tuple[str | None, list[PreparedTxn]]:
    """(write id, prepared transactions) reported by the tasks' commit messages."""
    write_id = None
    txns: list[PreparedTxn] = []
    for m in messages:
        if m is None or getattr(m, "prepared", None) is None:
            continue
        write_id = m.write_id
        tid, pid, epoch = m.prepared
        txns.append(PreparedTxn(tid, pid, epoch))
    return write_id, txns
