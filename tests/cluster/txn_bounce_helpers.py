"""Clients of the transaction bounce tests (``test_cluster_txn_bounce``): Kafka's
TransactionalMessageCopier as a thread, a concurrent read_committed reader of the output, and the
bouncer's waits on ZooKeeper (deregistration, full ISRs).

The copier owns input partitions by ``assign`` (no group membership, as Kafka's copier), reads
read_committed, writes each record to the output (key and value kept, so the output can be
compared with the input) and commits the consumed positions inside the transaction with
``send_offsets_to_transaction``. Every ``abort_every``-th transaction is aborted on purpose, and
any transaction whose commit fails abortably is aborted too; either way the copier seeks back to
the group's committed offsets (OffsetFetch, require_stable under read_committed), so the aborted
records are copied again - exactly once overall only if the aborted output is invisible, the
committed offsets are exactly those of the committed transactions, and nothing is lost or
doubled across coordinator moves.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from kazoo.exceptions import ConnectionLoss, SessionExpiredError

from exactly.cluster.zk import ClusterZk
from exactly.types import TopicPartition as ExactlyPartition

OFFSET_INVALID = -1001
# librdkafka's ``committed`` hands these to the application instead of asking FindCoordinator
# again (the Java consumer retries them): the group coordinator moved with a bounce
COORDINATOR_MOVED = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
    }
)
API_TIMEOUT_S = 30.0
# Abortable for librdkafka, but never a right answer in these tests: Kafka's coordinator answers
# INVALID_PRODUCER_ID_MAPPING only for an id it owns and does not know (or knows under another
# producer id: expiry, epoch exhaustion), none of which happens to a copier. A coordinator that
# lost its partition answers NOT_COORDINATOR. Once answered by a coordinator that had just
# resigned (txnbounce-s19.md); the abort that followed then met the real coordinator with no
# open transaction (fatal INVALID_TXN_STATE), which _abort excuses for librdkafka's own case.
NEVER_HERE = frozenset({KafkaError.INVALID_PRODUCER_ID_MAPPING})


def _debug_config(name: str, variable: str = "TXN_BOUNCE_RDKAFKA_DEBUG") -> dict[str, Any]:
    """``TXN_BOUNCE_RDKAFKA_DEBUG=eos,msg`` writes librdkafka's debug log of each copier's
    producer to ``$TXN_BOUNCE_RDKAFKA_LOG_DIR/<name>.log`` (finding out what a client saw);
    ``TXN_BOUNCE_RDKAFKA_CONSUMER_DEBUG=cgrp,fetch`` the one of its consumer, to
    ``<name>-consumer.log``."""
    debug = os.environ.get(variable)
    if not debug:
        return {}
    logger = logging.getLogger(f"rdkafka.{name}")
    for old in list(logger.handlers):  # one file per copier name, not one handler per test
        logger.removeHandler(old)
        old.close()
    handler = logging.FileHandler(Path(os.environ.get("TXN_BOUNCE_RDKAFKA_LOG_DIR", ".")) / f"{name}.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    logger.addHandler(handler)
    logger.propagate = False  # the debug log goes to its file, not into pytest's captured output
    logger.setLevel(logging.DEBUG)
    return {"debug": debug, "log_level": 7, "logger": logger}


def flush_before_abort(producer: Producer, timeout: float = API_TIMEOUT_S) -> bool:
    """Wait until every record of the open transaction has its answer; False if some has not.

    Call it before ``abort_transaction``: librdkafka's abort purges the records still queued and
    advances the partition's sequence base past them, as if they had never been sent - also a
    batch that was sent and written but whose answer was lost, waiting for its retry. The next
    transaction's first batch then carries the purged batch's sequence numbers, and the broker
    (like Kafka's: same producer id, epoch and sequence range as one of the last five batches)
    acknowledges it as a duplicate of the aborted batch without writing it. Once every record is
    answered the purge finds nothing (the Java producer's abortTransaction waits for sent batches
    too)."""
    return producer.flush(timeout) == 0


@dataclass
class CopierStats:
    committed: int = 0  # transactions committed
    aborted: int = 0  # on purpose
    failed: int = 0  # aborted after an abortable error
    recreated: int = 0  # producers replaced: a fatal abort, or purged records (see ``_abort``)
    fatal_aborts: int = 0  # abort_transaction failed fatally with INVALID_TXN_STATE (see ``_abort``)
    copied: int = 0  # records of committed transactions
    errors: list[str] = field(default_factory=list)


class TxnCopier(threading.Thread):
    """Copies ``partitions`` of ``source`` to ``sink`` until its committed offsets reach
    ``ends``. ``one_to_one`` writes input partition p to output partition p (order then must be
    preserved); otherwise librdkafka's partitioner spreads the records by key."""

    def __init__(
        self,
        bootstrap: Callable[[], str],
        name: str,
        source: str,
        sink: str,
        ends: dict[int, int],
        *,
        group: str,
        batch: int,
        abort_every: int = 3,
        one_to_one: bool = False,
        txn_timeout_ms: int = 10_000,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.source, self.sink, self.ends = source, sink, ends
        self.batch, self.abort_every, self.one_to_one = batch, abort_every, one_to_one
        self.stats = CopierStats()
        self.failure: BaseException | None = None
        self.stop_requested = threading.Event()
        common: dict[str, Any] = {"bootstrap.servers": bootstrap()}
        self.consumer = Consumer(
            {
                **common,
                "group.id": group,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 100,
                "log_level": 0,
                **_debug_config(f"{name}-consumer", "TXN_BOUNCE_RDKAFKA_CONSUMER_DEBUG"),
            }
        )
        self._servers = bootstrap  # not _bootstrap: threading.Thread has a method of that name
        self._producer_config: dict[str, Any] = {
            "transactional.id": f"{group}-{name}",
            "transaction.timeout.ms": txn_timeout_ms,
            "message.timeout.ms": txn_timeout_ms,
            "linger.ms": 5,
            # librdkafka issues 5511/5456: send_offsets_to_transaction waits, past its timeout,
            # for a state change of the cached group coordinator's broker handle; a broker killed
            # with -9 drops out of the metadata and its handle is decommissioned, so no state
            # change comes until some broker connection changes (the test's teardown). A
            # metadata refresh every second brings the restarted broker back as a new handle,
            # whose connection states re-run the coordinator lookup; idle connections closed
            # after two seconds make such state changes too.
            "topic.metadata.refresh.interval.ms": 1000,
            "connections.max.idle.ms": 2000,
            "log_level": 0,
            **_debug_config(name),
        }
        self.producer = self._new_producer()
        self.txns = 0
        self.positions_committed: dict[int, int] = {}

    # --------------------------------------------------------------- thread
    def run(self) -> None:
        try:
            self._retry(lambda: self.producer.init_transactions(API_TIMEOUT_S))
            self._rewind()
            while not self.stop_requested.is_set() and not self._done():
                self._copy_one()
        except BaseException as exc:  # reported by the test thread
            self.failure = exc
        finally:
            self.consumer.close()

    def committed_so_far(self) -> int:
        return self.stats.copied

    # ------------------------------------------------------------ internals
    def _done(self) -> bool:
        return all(self.positions_committed.get(p, 0) >= end for p, end in self.ends.items())

    def _copy_one(self) -> None:
        msgs = [m for m in self.consumer.consume(num_messages=self.batch, timeout=0.5)]
        for m in msgs:
            if m.error() is not None:
                raise KafkaException(m.error())
        if not msgs:
            return
        self.txns += 1
        abort_on_purpose = self.abort_every > 0 and self.txns % self.abort_every == 0
        try:
            self.producer.begin_transaction()
            for m in msgs:
                partition = m.partition() if self.one_to_one else None
                kwargs: dict[str, Any] = {} if partition is None else {"partition": partition}
                self._produce(m.key(), m.value(), kwargs)
            positions = self._positions(msgs)
            self._retry(
                lambda: self.producer.send_offsets_to_transaction(
                    [TopicPartition(self.source, p, o) for p, o in positions.items()],
                    self.consumer.consumer_group_metadata(),
                    API_TIMEOUT_S,
                )
            )
            if abort_on_purpose:
                self._abort(after_error=False)
                self.stats.aborted += 1
                self._rewind()
                return
            self._retry(lambda: self.producer.commit_transaction(API_TIMEOUT_S))
        except KafkaException as exc:
            err = exc.args[0]
            if not isinstance(err, KafkaError) or not err.txn_requires_abort():
                raise
            if err.code() in NEVER_HERE:
                raise
            self.stats.errors.append(err.str())
            self._abort(after_error=True)
            self.stats.failed += 1
            self._rewind()
            return
        self.positions_committed.update(positions)
        self.stats.committed += 1
        self.stats.copied += len(msgs)

    def _produce(self, key: bytes | None, value: bytes | None, kwargs: dict[str, Any]) -> None:
        while True:
            try:
                self.producer.produce(self.sink, key=key, value=value, **kwargs)
                return
            except BufferError:
                self.producer.poll(0.1)

    def _positions(self, msgs: Iterable[Any]) -> dict[int, int]:
        """The next offset to read of each partition the batch touched (plus the ones it did not,
        at their last committed position: the whole assignment is committed every time)."""
        positions = dict(self.positions_committed)
        for m in msgs:
            positions[m.partition()] = m.offset() + 1
        return positions

    def _new_producer(self) -> Producer:
        return Producer({"bootstrap.servers": self._servers(), **self._producer_config})

    def _abort(self, *, after_error: bool) -> None:
        """abort_transaction, so that no record of the next transaction is taken for a retry of
        this one, and a new producer instance when librdkafka's abort fails fatally.

        librdkafka's abort purges the messages still queued and advances the partition's
        sequence base past them ("ADVBASE"), as if they had never been sent. A batch that was
        sent and appended but whose answer was lost (its leader killed) waits in that queue for
        its retry: purged, its sequence numbers go to the first batch of the next transaction,
        which the broker - any Kafka broker - takes for a retry of the aborted batch (same
        producer id, epoch and sequence range: a duplicate) and acknowledges without writing it.
        That transaction then commits its offsets without its records: the input range is lost.
        The Java producer's abortTransaction lets sent batches complete instead; the copier does
        the same by flushing before it aborts on purpose. After an abortable error librdkafka has
        already purged its queues, so the copier takes a new producer instance (as it does when
        the flush does not finish): its init_transactions bumps the epoch, and the broker keeps
        no duplicates across epochs.

        The fatal case is librdkafka issue 4849 (also seen against Kafka): an
        AddPartitionsToTxn/AddOffsetsToTxn that failed with a transport error (the coordinator
        was killed while answering it) counts for librdkafka as possibly registered, so its
        abort sends EndTxn(ABORT) although the transaction never started at the coordinator,
        which is still in CompleteCommit/PrepareCommit of the previous one; Kafka's coordinator
        answers INVALID_TXN_STATE there, and so does ours. What librdkafka asks of an
        application after a fatal error is a new instance: its init_transactions fences the old
        epoch and completes or aborts whatever the old one left, and the copier rewinds to the
        committed offsets as after any abort, so exactly-once is still what the test checks."""
        replace = after_error or not flush_before_abort(self.producer)
        fatal: int | None = None
        try:
            self._retry(lambda: self.producer.abort_transaction(API_TIMEOUT_S))
        except KafkaException as exc:
            err = exc.args[0]
            if not (
                isinstance(err, KafkaError) and err.fatal() and err.code() == KafkaError.INVALID_TXN_STATE
            ):
                raise
            self.stats.errors.append(err.str())
            self.stats.fatal_aborts += 1
            replace, fatal = True, err.code()
        if replace:
            self._replace_producer(fatal)

    def _replace_producer(self, fatal: int | None = None) -> None:
        """A new instance instead of the current one, whose queues are purged first.

        ``fatal``: the code of the fatal error the old instance is dropped for. confluent-kafka
        raises an instance's fatal error once more from the next call that serves its queue
        (``error_cb`` turns librdkafka's ERR__FATAL event into ``cfl_PyErr_Fatal``), here the
        purge's flush: that one, and only that one, is expected (it once failed the copier
        right after the error was excused, on a fresh-clone CI run: txnbounce-s19.md)."""
        self.stats.recreated += 1
        old, self.producer = self.producer, self._new_producer()
        try:
            old.purge()
            old.flush(0)
        except KafkaException as exc:
            err = exc.args[0]
            if not (isinstance(err, KafkaError) and err.fatal() and err.code() == fatal):
                raise
        self._retry(lambda: self.producer.init_transactions(API_TIMEOUT_S))

    def _rewind(self) -> None:
        """Seek every input partition back to the group's committed offset, as Kafka's copier
        (``resetToLastCommittedPositions``): the aborted transaction's records come again."""
        tps = [TopicPartition(self.source, p) for p in self.ends]
        committed = self._retry(lambda: self.consumer.committed(tps, timeout=API_TIMEOUT_S))
        self.positions_committed = {tp.partition: max(tp.offset, 0) for tp in committed}
        # a new assignment rather than seek: always allowed, and librdkafka drops whatever it had
        # fetched for the old positions
        self.consumer.assign(
            [TopicPartition(self.source, p, o) for p, o in sorted(self.positions_committed.items())]
        )

    def _retry(self, call: Callable[[], Any]) -> Any:
        """``call`` again while it fails retriably (a coordinator moving, a timeout): librdkafka
        resumes the same transactional operation. Abortable and fatal errors propagate."""
        deadline = time.monotonic() + 120
        while True:
            try:
                return call()
            except KafkaException as exc:
                err = exc.args[0]
                retriable = isinstance(err, KafkaError) and not err.txn_requires_abort()
                retriable = retriable and (err.retriable() or err.code() in COORDINATOR_MOVED)
                if not retriable or time.monotonic() > deadline:
                    raise
                self.stats.errors.append(err.str())


class ConcurrentReader(threading.Thread):
    """A read_committed consumer of every output partition while the copy runs: what it reads
    (partition, key, value, offset) in order. Stops once asked and every partition's position
    reached ``final_ends`` (set by the test once the copiers are done)."""

    def __init__(self, bootstrap: Callable[[], str], topic: str, partitions: int) -> None:
        super().__init__(name="reader", daemon=True)
        self.topic, self.partitions = topic, partitions
        self.records: list[tuple[int, bytes | None, bytes | None, int]] = []
        self.final_ends: dict[int, int] | None = None
        self.failure: BaseException | None = None
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap(),
                "group.id": "concurrent-reader",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 100,
                "log_level": 0,
            }
        )

    def run(self) -> None:
        try:
            parts = [TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in range(self.partitions)]
            self.consumer.assign(parts)
            while True:
                for m in self.consumer.consume(num_messages=500, timeout=0.2):
                    if m.error() is not None:
                        if m.error().retriable():
                            continue
                        raise KafkaException(m.error())
                    self.records.append((m.partition(), m.key(), m.value(), m.offset()))
                ends = self.final_ends
                if ends is not None:
                    tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
                    positions = {tp.partition: tp.offset for tp in self.consumer.position(tps)}
                    if all(positions[p] >= end for p, end in ends.items() if end > 0):
                        return
        except BaseException as exc:
            self.failure = exc
        finally:
            self.consumer.close()


def partition_isrs(
    zk: ClusterZk, topics: Iterable[str]
) -> dict[tuple[str, int], tuple[int, tuple[int, ...]]]:
    """Leader and ISR of every partition of ``topics`` as ZooKeeper holds them."""
    states: dict[tuple[str, int], tuple[int, tuple[int, ...]]] = {}
    for topic in topics:
        assignment = zk.topic_assignment(topic)
        for p in sorted(assignment.partitions if assignment is not None else ()):
            observed = zk.partition_state(ExactlyPartition(topic, p))
            if observed is not None:
                state = observed.state.leader_and_isr
                states[(topic, p)] = (state.leader, tuple(sorted(state.isr)))
    return states


def deregistered(zk: ClusterZk, broker_id: int) -> bool:
    """``broker_id`` is gone from ZooKeeper's live brokers; False (ask again) when the test's own
    session was lost (see :func:`all_isrs_full`)."""
    try:
        return broker_id not in zk.live_brokers()
    except (SessionExpiredError, ConnectionLoss):
        return False


def all_isrs_full(zk: ClusterZk, topics: Iterable[str], brokers: int = 3) -> bool:
    """Every partition of ``topics`` led with all ``brokers`` in its ISR. False (ask again) when
    the test's own ZooKeeper session was lost: its 2 s timeout expires on a loaded box (seen at
    load 17), and kazoo opens a new session by itself; only reads go through it."""
    try:
        states = partition_isrs(zk, topics)
    except (SessionExpiredError, ConnectionLoss):
        return False
    full = tuple(range(brokers))
    return bool(states) and all(leader >= 0 and isr == full for leader, isr in states.values())
