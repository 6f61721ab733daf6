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
* :func:`find_hanging` - transactions open longer than a threshold.

This is a single-broker client: every request goes to the bootstrap broker, which is the
coordinator of every transactional id and the leader of every partition. Failures raise
:class:`OpsError` (a :class:`WireError`) with a one-line message.
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass

from exactly.client.wire import (
    ApiKey,
    DescribedTransactionState,
    WireClient,
    WireError,
    error_name,
)

OPEN_STATES = ("Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence")
DEFAULT_TXN_TIMEOUT_MS = 60_000
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
    client: WireClient,
    *,
    states: tuple[str, ...] = (),
    producer_ids: tuple[int, ...] = (),
    duration_ms: int = -1,
) -> list[ListedTransaction]:
    """ListTransactions; ``duration_ms`` >= 0 needs v1 (KIP-994)."""
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
    if int(response.error_code):
        raise OpsError(f"ListTransactions failed: {error_name(response.error_code)}")
    unknown = tuple(response.unknown_state_filters)
    if unknown:
        raise OpsError(
            f"unknown transaction state(s): {', '.join(unknown)} "
            "(states: Empty, Ongoing, PrepareCommit, PrepareAbort, CompleteCommit, CompleteAbort, "
            "PrepareEpochFence, Dead)"
        )
    out = [
        ListedTransaction(str(t.transactional_id), int(t.producer_id), str(t.transaction_state))
        for t in response.transaction_states
    ]
    return sorted(out, key=lambda t: t.transactional_id)


def describe_transactions(client: WireClient, ids: list[str]) -> list[DescribedTransactionState]:
    """DescribeTransactions, one entry per id in request order (errors left in ``error_code``)."""
    if not ids:
        return []
    version = client.version_for(ApiKey.DESCRIBE_TRANSACTIONS, 0)
    response = client.call(ApiKey.DESCRIBE_TRANSACTIONS, version, transactional_ids=tuple(ids))
    return list(response.transaction_states)


def describe_one(client: WireClient, tid: str) -> DescribedTransactionState:
    """DescribeTransactions of one id; raises OpsError unless it exists."""
    (state,) = describe_transactions(client, [tid])
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


def describe_producers(client: WireClient, topic: str, partition: int) -> list[ActiveProducer]:
    version = client.version_for(ApiKey.DESCRIBE_PRODUCERS, 0)
    mod = client.module(ApiKey.DESCRIBE_PRODUCERS, version)
    response = client.call(
        ApiKey.DESCRIBE_PRODUCERS,
        version,
        topics=(mod.TopicRequest(name=topic, partition_indexes=(partition,)),),
    )
    for t in response.topics:
        for p in t.partitions:
            if int(p.partition_index) != partition:
                continue
            code = error_name(p.error_code)
            if code == "UNKNOWN_TOPIC_OR_PARTITION":
                raise OpsError(f"topic '{topic}' has no partition {partition}")
            if p.error_code:
                detail = f" ({p.error_message})" if p.error_message else ""
                raise OpsError(f"DescribeProducers {topic}-{partition} failed: {code}{detail}")
            return [
                ActiveProducer(
                    int(s.producer_id),
                    int(s.producer_epoch),
                    int(s.last_sequence),
                    int(s.last_timestamp),
                    int(s.coordinator_epoch),
                    int(s.current_txn_start_offset),
                )
                for s in p.active_producers
            ]
    raise OpsError(f"DescribeProducers: no answer for {topic}-{partition}")


# ---------------------------------------------------------------------- abort
@dataclass(frozen=True, slots=True)
class FenceResult:
    before: DescribedTransactionState
    producer_id: int
    producer_epoch: int
    after: DescribedTransactionState | None


def fence_transactional_id(client: WireClient, tid: str, *, timeout_s: float) -> FenceResult:
    """InitProducerId(tid): aborts the open transaction and fences its producer (epoch bump)."""
    before = describe_one(client, tid)  # never create an id that does not exist
    timeout_ms = (
        before.transaction_timeout_ms if before.transaction_timeout_ms > 0 else DEFAULT_TXN_TIMEOUT_MS
    )
    version = client.version_for(ApiKey.INIT_PRODUCER_ID)
    deadline = time.monotonic() + timeout_s
    backoff = 0.05
    while True:
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
        if code not in _RETRIABLE_INIT:
            raise OpsError(f"InitProducerId for '{tid}' failed: {code}")
        if time.monotonic() + backoff > deadline:
            raise OpsError(f"the transaction of '{tid}' is still completing ({code}); try again later")
        time.sleep(backoff)
        backoff = min(backoff * 2, 1.0)
    try:
        after: DescribedTransactionState | None = describe_one(client, tid)
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
    client: WireClient, topic: str, partition: int, producer_id: int | None = None
) -> PartitionAbort:
    """Write an ABORT marker for the open transaction of a producer on one partition."""
    producers = describe_producers(client, topic, partition)
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
    version = client.version_for(ApiKey.WRITE_TXN_MARKERS)
    mod = client.module(ApiKey.WRITE_TXN_MARKERS, version)
    marker = mod.WritableTxnMarker(
        producer_id=target.producer_id,
        producer_epoch=target.producer_epoch,
        transaction_result=False,  # ABORT
        topics=(mod.WritableTxnMarkerTopic(name=topic, partition_indexes=(partition,)),),
        coordinator_epoch=coordinator_epoch,
    )
    response = client.call(ApiKey.WRITE_TXN_MARKERS, version, markers=(marker,))
    for m in response.markers:
        for t in m.topics:
            for p in t.partitions:
                if p.error_code:
                    raise OpsError(
                        f"WriteTxnMarkers ABORT for producer {target.producer_id} on "
                        f"{t.name}-{p.partition_index} failed: {error_name(p.error_code)}"
                    )
    return PartitionAbort(topic, partition, target, coordinator_epoch)


# ---------------------------------------------------------------------- hanging
def find_hanging(client: WireClient, max_age_ms: int) -> list[tuple[DescribedTransactionState, int]]:
    """Open transactions (Ongoing/Prepare*) older than ``max_age_ms`` -> (state, age ms)."""
    version = client.version_for(ApiKey.LIST_TRANSACTIONS, 1)
    listed = list_transactions(client, states=OPEN_STATES, duration_ms=max_age_ms if version >= 1 else -1)
    described = describe_transactions(client, [t.transactional_id for t in listed])
    now = now_ms()
    out: list[tuple[DescribedTransactionState, int]] = []
    for state in described:
        if state.error_code or not is_open(state) or state.transaction_start_time_ms < 0:
            continue  # finished or expired between the two requests
        age = now - state.transaction_start_time_ms
        if age > max_age_ms:
            out.append((state, age))
    return sorted(out, key=lambda sa: -sa[1])
