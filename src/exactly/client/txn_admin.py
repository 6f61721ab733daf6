"""KIP-664 transaction administration over the wire: what ``kafka-transactions.sh`` does.

* :func:`list_transactions` - ListTransactions (state, producer id and duration filters).
* :func:`describe_transactions` - DescribeTransactions.
* :func:`describe_producers` - DescribeProducers for one partition.
* :func:`fence_transactional_id` - InitProducerId with the transactional.id: the coordinator
  aborts the open transaction (ABORT markers to its partitions) and bumps the epoch, so the
  producer that held the id is fenced. Retried while the coordinator answers
  CONCURRENT_TRANSACTIONS (it is still writing markers).
* :func:`abort_partition_transaction` - the hanging-transaction path: find the producer with an
  open transaction on a partition (DescribeProducers) and write an ABORT marker for it there
  (WriteTxnMarkers), whatever the coordinator thinks.
* :func:`find_hanging` - KIP-664's hanging transactions: open on a partition (DescribeProducers
  at its leader) for longer than a threshold while no coordinator expects to end them there.

Every function takes a :class:`~exactly.client.broker_pool.BrokerPool`, which routes each request
as Kafka's admin client does (the partition's leader, the id's coordinator, every broker for
ListTransactions); a single broker is the one-broker case of the same routing. Failures raise
:class:`OpsError` (a :class:`WireError`) with a one-line message.
"""

from __future__ import annotations

import datetime
import functools
import time
from dataclasses import dataclass
from typing import Any

from exactly.client.broker_pool import RETRIABLE, BrokerPool, Retry
from exactly.client.wire import (
    ApiKey,
    DescribedTransactionState,
    WireClient,
    WireError,
    error_name,
)
from exactly.types import TopicPartition

OPEN_STATES = ("Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence")
DEFAULT_TXN_TIMEOUT_MS = 60_000
TWO_PHASE_COMMIT_TIMEOUT_MS = 2**31 - 1  # KIP-939: the timeout a 2PC producer's id is stored with
_RETRIABLE_INIT = frozenset({"CONCURRENT_TRANSACTIONS", "COORDINATOR_LOAD_IN_PROGRESS"})


class OpsError(WireError):
    """An administrative operation failed; the message is one line for the user."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# ---------------------------------------------------------------------- list / describe
@dataclass(frozen=True, slots=True)
class ListedTransaction:
    transactional_id: str
    producer_id: int
    state: str


def list_transactions(
    pool: BrokerPool,
    *,
    states: tuple[str, ...] = (),
    producer_ids: tuple[int, ...] = (),
    duration_ms: int = -1,
) -> list[ListedTransaction]:
    """ListTransactions to every live broker, merged (each coordinator knows the ids of the
    transaction log partitions it leads); ``duration_ms`` >= 0 needs v1 (KIP-994)."""
    merged: dict[str, ListedTransaction] = {}
    for broker_id in pool.broker_ids():
        attempt = functools.partial(_list_at, pool, broker_id, states, producer_ids, duration_ms)
        for listed in pool.retrying(f"ListTransactions at broker {broker_id}", attempt):
            merged.setdefault(listed.transactional_id, listed)  # an id met twice is moving: keep one
    return sorted(merged.values(), key=lambda t: t.transactional_id)


def _list_at(
    pool: BrokerPool,
    broker_id: int,
    states: tuple[str, ...],
    producer_ids: tuple[int, ...],
    duration_ms: int,
) -> list[ListedTransaction]:
    client = pool.client(broker_id)
    version = client.version_for(ApiKey.LIST_TRANSACTIONS, 1)
    if duration_ms >= 0 and version < 1:
        raise OpsError("the broker does not support a duration filter (ListTransactions v1)")
    response = client.call(
        ApiKey.LIST_TRANSACTIONS,
        version,
        state_filters=tuple(states),
        producer_id_filters=tuple(producer_ids),
        duration_filter=duration_ms,
    )
    code = error_name(response.error_code)
    if code in RETRIABLE:
        raise Retry(code)
    if int(response.error_code):
        raise OpsError(f"ListTransactions failed: {code}")
    unknown = tuple(response.unknown_state_filters)
    if unknown:
        raise OpsError(
            f"unknown transaction state(s): {', '.join(unknown)} "
            "(states: Empty, Ongoing, PrepareCommit, PrepareAbort, CompleteCommit, CompleteAbort, "
            "PrepareEpochFence, Dead)"
        )
    return [
        ListedTransaction(str(t.transactional_id), int(t.producer_id), str(t.transaction_state))
        for t in response.transaction_states
    ]


def describe_transactions(pool: BrokerPool, ids: list[str]) -> list[DescribedTransactionState]:
    """DescribeTransactions at each id's coordinator, one entry per id in request order
    (errors left in ``error_code``; coordinator moves retried)."""
    return [
        pool.retrying(f"DescribeTransactions of '{tid}'", functools.partial(_describe_at, pool, tid))
        for tid in ids
    ]


def _describe_at(pool: BrokerPool, tid: str) -> DescribedTransactionState:
    client = pool.coordinator(tid)
    version = client.version_for(ApiKey.DESCRIBE_TRANSACTIONS, 0)
    response = client.call(ApiKey.DESCRIBE_TRANSACTIONS, version, transactional_ids=(tid,))
    (state,) = response.transaction_states
    code = error_name(state.error_code)
    if code in RETRIABLE:
        raise Retry(code)
    return state  # type: ignore[no-any-return]


def describe_one(pool: BrokerPool, tid: str) -> DescribedTransactionState:
    """DescribeTransactions of one id; raises OpsError unless it exists."""
    (state,) = describe_transactions(pool, [tid])
    code = error_name(state.error_code)
    if code == "TRANSACTIONAL_ID_NOT_FOUND":
        raise OpsError(f"transactional id '{tid}' not found")
    if state.error_code:
        raise OpsError(f"cannot describe transactional id '{tid}': {code}")
    return state


def partitions_text(state: DescribedTransactionState) -> str:
    parts = [f"{t.topic}-{p}" for t in state.topics for p in t.partitions]
    return ",".join(parts) if parts else "None"


def is_open(state: DescribedTransactionState) -> bool:
    return state.transaction_state in OPEN_STATES


# ---------------------------------------------------------------------- producers
@dataclass(frozen=True, slots=True)
class ActiveProducer:
    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int
    current_txn_start_offset: int

    @classmethod
    def from_response(cls, state: Any) -> ActiveProducer:
        """From one ``ProducerState`` of a DescribeProducers answer."""
        return cls(
            int(state.producer_id),
            int(state.producer_epoch),
            int(state.last_sequence),
            int(state.last_timestamp),
            int(state.coordinator_epoch),
            int(state.current_txn_start_offset),
        )


def describe_producers(pool: BrokerPool, topic: str, partition: int) -> list[ActiveProducer]:
    """DescribeProducers at the partition's leader (a follower's producer state may lag)."""
    tp = TopicPartition(topic, partition)
    return pool.retrying(
        f"DescribeProducers {topic}-{partition}", lambda: _describe_producers_at(pool.leader(tp), tp)
    )


def _describe_producers_at(client: WireClient, tp: TopicPartition) -> list[ActiveProducer]:
    version = client.version_for(ApiKey.DESCRIBE_PRODUCERS, 0)
    mod = client.module(ApiKey.DESCRIBE_PRODUCERS, version)
    response = client.call(
        ApiKey.DESCRIBE_PRODUCERS,
        version,
        topics=(mod.TopicRequest(name=tp.topic, partition_indexes=(tp.partition,)),),
    )
    for t in response.topics:
        for p in t.partitions:
            if int(p.partition_index) != tp.partition:
                continue
            code = error_name(p.error_code)
            if code in RETRIABLE:
                raise Retry(code)
            if code == "UNKNOWN_TOPIC_OR_PARTITION":
                raise OpsError(f"topic '{tp.topic}' has no partition {tp.partition}")
            if p.error_code:
                detail = f" ({p.error_message})" if p.error_message else ""
                raise OpsError(f"DescribeProducers {tp.topic}-{tp.partition} failed: {code}{detail}")
            return [ActiveProducer.from_response(s) for s in p.active_producers]
    raise OpsError(f"DescribeProducers: no answer for {tp.topic}-{tp.partition}")


# ---------------------------------------------------------------------- abort
@dataclass(frozen=True, slots=True)
class FenceResult:
    before: DescribedTransactionState
    producer_id: int
    producer_epoch: int
    after: DescribedTransactionState | None


def fence_transactional_id(pool: BrokerPool, tid: str, *, timeout_s: float) -> FenceResult:
    """InitProducerId(tid) at its coordinator: aborts the open transaction and fences its
    producer (epoch bump)."""
    before = describe_one(pool, tid)  # never create an id that does not exist
    # A two-phase-commit id (KIP-939) stores the maximal timeout, which no plain InitProducerId may
    # ask for; without enable_2pc/keep_prepared_txn the coordinator aborts its prepared transaction.
    timeout_ms = (
        before.transaction_timeout_ms
        if 0 < before.transaction_timeout_ms < TWO_PHASE_COMMIT_TIMEOUT_MS
        else DEFAULT_TXN_TIMEOUT_MS
    )
    deadline = time.monotonic() + timeout_s
    backoff = 0.05
    while True:
        client = pool.retrying(f"FindCoordinator for '{tid}'", lambda: pool.coordinator(tid))
        version = client.version_for(ApiKey.INIT_PRODUCER_ID)
        response = client.call(
            ApiKey.INIT_PRODUCER_ID,
            version,
            transactional_id=tid,
            transaction_timeout=datetime.timedelta(milliseconds=timeout_ms),
            producer_id=-1,
            producer_epoch=-1,
        )
        code = error_name(response.error_code)
        if not response.error_code:
            break
        if code not in _RETRIABLE_INIT and code not in RETRIABLE:
            raise OpsError(f"InitProducerId for '{tid}' failed: {code}")
        if time.monotonic() + backoff > deadline:
            raise OpsError(f"the transaction of '{tid}' is still completing ({code}); try again later")
        time.sleep(backoff)
        backoff = min(backoff * 2, 1.0)
    try:
        after: DescribedTransactionState | None = describe_one(pool, tid)
    except OpsError:
        after = None
    return FenceResult(before, int(response.producer_id), int(response.producer_epoch), after)


@dataclass(frozen=True, slots=True)
class PartitionAbort:
    topic: str
    partition: int
    producer: ActiveProducer
    coordinator_epoch: int


def abort_partition_transaction(
    pool: BrokerPool, topic: str, partition: int, producer_id: int | None = None
) -> PartitionAbort:
    """Write an ABORT marker for the open transaction of a producer on one partition, at the
    partition's leader, with the producer's id and epoch and the coordinator epoch the leader
    last saw for it (Kafka's ``Admin.abortTransaction``)."""
    producers = describe_producers(pool, topic, partition)
    if producer_id is not None:
        match = [p for p in producers if p.producer_id == producer_id]
        if not match:
            raise OpsError(f"producer {producer_id} is not active on {topic}-{partition}")
        target = match[0]
        if target.current_txn_start_offset < 0:
            raise OpsError(f"producer {producer_id} has no open transaction on {topic}-{partition}")
    else:
        open_ = [p for p in producers if p.current_txn_start_offset >= 0]
        if not open_:
            raise OpsError(f"no open transaction on {topic}-{partition}")
        if len(open_) > 1:
            ids = ", ".join(str(p.producer_id) for p in open_)
            raise OpsError(
                f"{len(open_)} producers have open transactions on {topic}-{partition} ({ids}): "
                "choose one with --producer-id"
            )
        target = open_[0]
    coordinator_epoch = max(target.coordinator_epoch, 0)  # -1: no marker seen yet
    tp = TopicPartition(topic, partition)
    pool.retrying(
        f"WriteTxnMarkers ABORT on {topic}-{partition}",
        lambda: _write_abort_at(pool.leader(tp), tp, target, coordinator_epoch),
    )
    return PartitionAbort(topic, partition, target, coordinator_epoch)


def _write_abort_at(
    client: WireClient, tp: TopicPartition, target: ActiveProducer, coordinator_epoch: int
) -> None:
    version = client.version_for(ApiKey.WRITE_TXN_MARKERS)
    mod = client.module(ApiKey.WRITE_TXN_MARKERS, version)
    marker = mod.WritableTxnMarker(
        producer_id=target.producer_id,
        producer_epoch=target.producer_epoch,
        transaction_result=False,  # ABORT
        topics=(mod.WritableTxnMarkerTopic(name=tp.topic, partition_indexes=(tp.partition,)),),
        coordinator_epoch=coordinator_epoch,
    )
    response = client.call(ApiKey.WRITE_TXN_MARKERS, version, markers=(marker,))
    for m in response.markers:
        for t in m.topics:
            for p in t.partitions:
                code = error_name(p.error_code)
                if code in RETRIABLE:
                    raise Retry(code)
                if p.error_code:
                    raise OpsError(
                        f"WriteTxnMarkers ABORT for producer {target.producer_id} on "
                        f"{t.name}-{p.partition_index} failed: {code}"
                    )


# ---------------------------------------------------------------------- hanging
@dataclass(frozen=True, slots=True)
class HangingTransaction:
    """An open transaction on a partition that no coordinator will end there: the producer's
    id is unknown to every coordinator, or its transaction does not include the partition."""

    tp: TopicPartition
    producer: ActiveProducer
    transactional_id: str | None
    duration_ms: int


def find_hanging(
    pool: BrokerPool,
    max_age_ms: int,
    *,
    topic: str | None = None,
    partition: int | None = None,
    broker_id: int | None = None,
) -> list[HangingTransaction]:
    """Kafka's ``kafka-transactions.sh find-hanging``: DescribeProducers at each partition's
    leader (of ``topic``/``partition``, or of every partition ``broker_id`` hosts, or of every
    non-internal partition) for producers with an open transaction whose last write is older
    than ``max_age_ms``; then ListTransactions (every broker) maps their producer ids to
    transactional ids and DescribeTransactions (their coordinators) says whether the
    transaction still includes the partition. Those that do not are hanging."""
    partitions = pool.partitions(None if topic is None else [topic])
    if partition is not None:
        partitions = [p for p in partitions if p.tp.partition == partition]
        if not partitions:
            raise OpsError(f"topic '{topic}' has no partition {partition}")
    if broker_id is not None:
        partitions = [p for p in partitions if broker_id in p.replicas]
    now = now_ms()
    candidates: list[tuple[TopicPartition, ActiveProducer]] = []
    for p in partitions:
        for producer in describe_producers(pool, p.tp.topic, p.tp.partition):
            if producer.current_txn_start_offset >= 0 and now - producer.last_timestamp > max_age_ms:
                candidates.append((p.tp, producer))
    if not candidates:
        return []
    pids = tuple(sorted({producer.producer_id for _tp, producer in candidates}))
    tid_of = {t.producer_id: t.transactional_id for t in list_transactions(pool, producer_ids=pids)}
    described = {d.transactional_id: d for d in describe_transactions(pool, sorted(set(tid_of.values())))}
    out: list[HangingTransaction] = []
    for tp, producer in candidates:
        tid = tid_of.get(producer.producer_id)
        state = described.get(tid) if tid is not None else None
        if state is not None and not state.error_code and _includes(state, tp):
            continue  # its coordinator will write the marker there
        out.append(HangingTransaction(tp, producer, tid, now - producer.last_timestamp))
    return sorted(out, key=lambda h: (h.tp.topic, h.tp.partition, h.producer.producer_id))


def _includes(state: DescribedTransactionState, tp: TopicPartition) -> bool:
    return any(t.topic == tp.topic and tp.partition in t.partitions for t in state.topics)
