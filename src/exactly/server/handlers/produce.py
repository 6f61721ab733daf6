"""Produce (0): validate each partition's single v2 batch in place, append, answer.

The request is parsed by hand (protocol.fast) so each partition's records are a memoryview into
the request frame: offsets are patched there and the bytes go to the segment without a copy.
No record is decoded: ``validate_produce_records`` reads the 61-byte header and checks the CRC,
``PartitionLog.append`` patches the base offset and asks producer state whether the batch is a
duplicate (ack with the original offset, write nothing), out of order (45) or fenced (47).

Errors per partition as Kafka returns them; one partition's failure does not affect the others.
acks must be 0, 1 or -1 (INVALID_REQUIRED_ACKS otherwise); acks=0 gets no response at all. With a
single broker the high watermark moves with the log end offset, so acks=1 and acks=all are
answered the same way (everything in the ISR has it).

In a cluster an acks=all append waits for the ISR (Kafka's DelayedProduce). When the connection
can take it (``ctx.may_defer``) the handler returns a ``Deferred`` right after the appends, and
the connection handles the client's next pipelined Produce while this one waits (answers still in
request order). That answer is a ``PendingAnswer`` resolved by the wake that completes the last
delayed partition (``delayed_produce``), with no task per produce: the connection writes it
within that call. Kafka instead mutes the connection until the answer is sent; here that made a
client's acks=all produces queue behind each other's replication round trip (one Produce per
~1 ms round trip at 1,000 requests/s). The appends themselves still happen one request at a time
in arrival order, so what is written, and where, is what Kafka writes for the same requests; only
the moment a later request's append happens moves earlier.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import ApiKey
from exactly.protocol.fast import (
    ProducePartitionResult,
    ProduceRequestData,
    encode_produce_response,
    parse_produce_request,
)
from exactly.records.batch import BatchHeader, InvalidRecordError, validate_produce_records
from exactly.replication.leader import AckOutcome
from exactly.server.authz import TOPIC, TXN_ID, WRITE, authorize
from exactly.server.clock import now_ms
from exactly.server.deferred_response import Deferred, PendingAnswer
from exactly.server.delayed_produce import Parked
from exactly.server.txn_verification import NOT_IN_TXN_MESSAGE, VerificationGuard, produce_error
from exactly.storage.leader_epoch import INITIAL_LEADER_EPOCH
from exactly.storage.partition_log import AppendResult, PartitionLog
from exactly.storage.producer_state import ProducerStateError
from exactly.topics import INTERNAL_TOPICS
from exactly.types import TopicPartition

if TYPE_CHECKING:
    from exactly.replication.leader import LeaderPartition
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.PRODUCE
parse_request = parse_produce_request  # records stay memoryviews into the frame

log = logging.getLogger("exactly.produce")
_NO_ERROR = ErrorCode.none  # a module constant: an enum member lookup is a dict walk in 3.11


async def handle(
    broker: Broker, ctx: RequestContext, request: ProduceRequestData
) -> bytes | Deferred[bytes] | None:
    acks = request.acks
    now = now_ms()
    topics_out: list[tuple[str, list[ProducePartitionResult]]] = []
    delayed: list[_Delayed] = []
    remote: list[tuple[list[ProducePartitionResult], int, str, memoryview | None, _VerifyRemotely]] = []
    # Authorization (Kafka's order): WRITE on the transactional id refuses the whole request,
    # then WRITE on each topic, before any existence check
    txn_denied = request.transactional_id is not None and not authorize(
        broker, ctx, WRITE, TXN_ID, request.transactional_id
    )
    for topic in request.topics:
        name = topic.name
        parts_out: list[ProducePartitionResult] = []
        denied: ErrorCode | None = None
        if txn_denied:
            denied = ErrorCode.transactional_id_authorization_failed
        elif not authorize(broker, ctx, WRITE, TOPIC, name):
            denied = ErrorCode.topic_authorization_failed
        for pdata in topic.partitions:
            if denied is not None:
                outcome: _Outcome = (denied, None, None)
            elif acks not in (0, 1, -1):
                outcome = (ErrorCode.invalid_required_acks, None, None)
            else:
                try:
                    outcome = _append(broker, name, pdata.index, pdata.records, request, now)
                except _VerifyRemotely as pending:
                    # KIP-890 at a leader that is not the coordinator: answered after the
                    # coordinator's verification (below), in this slot
                    parts_out.append(ProducePartitionResult(pdata.index, 0, -1, -1, -1, None))
                    remote.append((parts_out, len(parts_out) - 1, name, pdata.records, pending))
                    continue
            _record(broker, request, name, pdata.index, outcome, parts_out, delayed)
        topics_out.append((name, parts_out))
    if remote:
        ctx.before_park()  # the coordinator's verification is a round trip: do not hold answers
        await _verify_and_append(broker, request, remote, delayed)
    if delayed:
        # acks=all in a cluster: answered once the ISR has the records (Kafka's DelayedProduce).
        answer = _answer_when_replicated(broker, ctx.version, topics_out, delayed)
        if ctx.may_defer:
            return Deferred(answer)
        ctx.before_park()  # answers the connection holds back must not wait for the ISR too
        return await answer.wait()
    if acks == 0:
        return None
    return encode_produce_response(ctx.version, topics_out)


@dataclass(frozen=True, slots=True)
class _Delayed:
    """One acks=all partition's wait for the ISR: its answer goes to ``parts[slot]``."""

    parts: list[ProducePartitionResult]
    slot: int
    tp: TopicPartition
    leader: LeaderPartition
    required_offset: int
    min_isr: int
    timeout_s: float


def _answer_when_replicated(
    broker: Broker,
    version: int,
    topics_out: list[tuple[str, list[ProducePartitionResult]]],
    delayed: list[_Delayed],
) -> PendingAnswer[bytes]:
    """The acks=all answer, resolved (by the wake that completes the last delayed partition, no
    task in between) once every delayed partition is done (acks is -1 here, never 0).
    Cancelling it (the connection is gone) discards the partitions still parked."""
    replicas = broker.replicas
    assert replicas is not None  # only a cluster leader delays a produce
    answer: PendingAnswer[bytes] = PendingAnswer()
    left = len(delayed)

    def settle(wait: _Delayed, code: ErrorCode) -> None:
        nonlocal left
        if code != _NO_ERROR:
            broker.metrics.error(ApiKey.PRODUCE, code)
            wait.parts[wait.slot] = ProducePartitionResult(
                wait.parts[wait.slot].index, int(code), -1, -1, -1, None
            )
        left -= 1
        if left == 0:
            answer.set_result(encode_produce_response(version, topics_out))

    for wait in delayed:
        entry = replicas.park_for_acks(
            wait.tp, wait.leader, wait.required_offset, wait.min_isr, wait.timeout_s, partial(settle, wait)
        )
        if isinstance(entry, Parked):
            answer.on_cancel(partial(replicas.delayed_produces.discard, entry))
        else:
            settle(wait, entry)
    return answer


_Outcome = tuple[ErrorCode, str | None, AppendResult | None]


def _record(
    broker: Broker,
    request: ProduceRequestData,
    topic: str,
    index: int,
    outcome: _Outcome,
    parts_out: list[ProducePartitionResult],
    delayed: list[_Delayed],
    slot: int | None = None,
) -> None:
    """Put one partition's answer in ``parts_out`` (appended, or at ``slot``); an acks=all
    append in a cluster also gets its wait for the ISR in ``delayed``."""
    code, message, result = outcome
    if code:
        broker.metrics.error(API_KEY, code)
    if result is None:
        answer = ProducePartitionResult(index, int(code), -1, -1, -1, message)
    else:
        answer = ProducePartitionResult(
            index, 0, result.first_offset, result.log_append_time, result.log_start_offset
        )
    if slot is None:
        parts_out.append(answer)
        slot = len(parts_out) - 1
    else:
        parts_out[slot] = answer
    replicas = broker.replicas
    if result is None or request.acks != -1 or replicas is None:
        return
    tp = TopicPartition(topic, index)
    leader = replicas.leaders.get(tp)
    plog = broker.partition(topic, index)
    if leader is None or plog is None:
        return
    # Kafka's tryCompleteElseWatch: an ISR of one (RF 1) has moved the HW already, so only a
    # produce that must wait becomes a delayed one.
    required = result.last_offset + 1
    min_isr = plog.config.min_insync_replicas
    acks = leader.check_acks_all(required, min_isr)
    if acks is AckOutcome.WAIT:
        delayed.append(_Delayed(parts_out, slot, tp, leader, required, min_isr, request.timeout_ms / 1000))
    elif acks is AckOutcome.NOT_ENOUGH_REPLICAS_AFTER_APPEND:
        code = ErrorCode.not_enough_replicas_after_append
        broker.metrics.error(ApiKey.PRODUCE, code)
        parts_out[slot] = ProducePartitionResult(index, int(code), -1, -1, -1, None)


async def _verify_and_append(
    broker: Broker,
    request: ProduceRequestData,
    remote: list[tuple[list[ProducePartitionResult], int, str, memoryview | None, _VerifyRemotely]],
    delayed: list[_Delayed],
) -> None:
    """One AddPartitionsToTxn v4 (verify_only) per producer epoch to the coordinator, then the
    second pass of the verified partitions' appends, each under its guard."""
    verifier = broker.txn_verifier
    tid = request.transactional_id
    assert tid is not None  # _verify_transactional refuses a transactional batch without one
    groups: dict[tuple[int, int], list[TopicPartition]] = defaultdict(list)
    for _parts, _slot, topic, _records, pending in remote:
        groups[(pending.producer_id, pending.producer_epoch)].append(TopicPartition(topic, pending.partition))
    answers = await asyncio.gather(
        *(verifier.verify(tid, pid, epoch, tps) for (pid, epoch), tps in groups.items())
    )
    codes = {
        (pid, tp): code
        for ((pid, _epoch), _tps), answer in zip(groups.items(), answers, strict=True)
        for tp, code in answer.items()
    }
    now = now_ms()
    for parts_out, slot, topic, records, pending in remote:
        tp = TopicPartition(topic, pending.partition)
        code = codes.get((pending.producer_id, tp), ErrorCode.network_exception)
        problem = produce_error(code, tp)
        if problem is not None:
            verifier.forget(tp, pending.producer_id, pending.guard)
            outcome: _Outcome = (problem[0], problem[1], None)
        else:
            try:
                outcome = _append(broker, topic, pending.partition, records, request, now, pending.guard)
            except _VerifyRemotely:  # the guard was replaced meanwhile: not verified
                outcome = (
                    ErrorCode.invalid_txn_state,
                    f"{NOT_IN_TXN_MESSAGE} ({topic}-{pending.partition})",
                    None,
                )
        _record(broker, request, topic, pending.partition, outcome, parts_out, delayed, slot)


def _append(
    broker: Broker,
    topic: str,
    partition: int,
    records: memoryview | None,
    request: ProduceRequestData,
    now: int,
    guard: VerificationGuard | None = None,
) -> _Outcome:
    """Validate and append one partition's batch. Raises :class:`_VerifyRemotely` when a
    transactional batch needs the verification of a coordinator on another broker first;
    ``guard`` is that verification's, for the second attempt."""
    plog = broker.partition(topic, partition)
    replicas = broker.replicas
    # The single broker (replicas is None) builds no TopicPartition here: this runs per batch.
    tp = None if replicas is None else TopicPartition(topic, partition)
    managed = replicas is not None and tp is not None and replicas.manages(tp)
    if plog is None and not managed:
        return ErrorCode.unknown_topic_or_partition, None, None
    if topic in INTERNAL_TOPICS:
        return ErrorCode.invalid_topic_exception, f"Cannot append to internal topic {topic}", None
    if records is None:
        return ErrorCode.invalid_record, "produce request has no records", None
    leader_epoch = INITIAL_LEADER_EPOCH
    leader: LeaderPartition | None = None
    if managed and replicas is not None and tp is not None:
        # Cluster: only the leader appends, stamping its epoch; acks=all is refused before the
        # append when the committed ISR is below min.insync.replicas (Kafka's order).
        code, leader = replicas.leader_for_write(tp)
        if leader is None or plog is None:
            return code, None, None
        code = leader.check_before_append(request.acks, plog.config.min_insync_replicas)
        if code != ErrorCode.none:
            return code, f"The size of the current ISR {list(leader.isr)} is insufficient", None
        leader_epoch = leader.leader_epoch
    if plog is None:
        return ErrorCode.unknown_topic_or_partition, None, None
    try:
        header = validate_produce_records(records)
        if header.is_transactional:
            problem = _verify_transactional(
                broker, plog, topic, partition, header, request.transactional_id, leader, guard
            )
            if problem is not None:
                return problem[0], problem[1], None
        result = plog.append(records, header, leader_epoch=leader_epoch, now_ms=now)
    except InvalidRecordError as exc:
        log.info("rejected batch for %s-%d: %s", topic, partition, exc)
        return exc.error_code, str(exc), None
    except ProducerStateError as exc:
        log.info("rejected batch for %s-%d: %s", topic, partition, exc)
        return exc.error_code, str(exc), None
    except OSError as exc:
        log.error("storage error appending to %s-%d: %s", topic, partition, exc)
        return ErrorCode.kafka_storage_error, str(exc), None
    if result.duplicate:
        broker.metrics.duplicate_batches += 1
    else:
        broker.metrics.messages_in += header.record_count
        broker.after_append(plog)
    return _NO_ERROR, None, result


class _VerifyRemotely(Exception):
    """The batch's transactional id is coordinated by another broker: verify there first."""

    def __init__(
        self, partition: int, producer_id: int, producer_epoch: int, guard: VerificationGuard
    ) -> None:
        super().__init__(partition)
        self.partition = partition
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.guard = guard


def _verify_transactional(
    broker: Broker,
    plog: PartitionLog,
    topic: str,
    partition: int,
    header: BatchHeader,
    transactional_id: str | None,
    leader: LeaderPartition | None,
    guard: VerificationGuard | None,
) -> tuple[ErrorCode, str] | None:
    """KIP-890 part 1: before a producer's first transactional write to a partition, check with
    the coordinator that the partition is in its ongoing transaction. Without this, a write
    delayed past the end of its transaction would start a new "transaction" nobody will ever
    end, holding back the LSO forever (the hanging transaction Jepsen found in Kafka).

    The coordinator on this broker is asked directly; one on another broker by
    :class:`~exactly.server.txn_verification.TxnVerifier` (raises :class:`_VerifyRemotely`;
    the second attempt brings the ``guard`` of that verification). Off with
    ``transaction.partition.verification.enable=false``, as in Kafka."""
    if transactional_id is None:
        return ErrorCode.invalid_record, "transactional batch without a transactional id"
    entry = plog.producer_state.last_entry(header.producer_id)
    if (
        entry is not None
        and entry.current_txn_first_offset is not None
        and entry.producer_epoch == header.producer_epoch
    ):
        return None  # already inside this producer's transaction here: verified at its first write
    if not broker.txn_verification_enabled:
        return None
    tp = TopicPartition(topic, partition)
    if guard is not None:  # second attempt, after the remote coordinator said yes
        if broker.txn_verifier.consume(tp, header.producer_id, guard):
            return None
        return ErrorCode.invalid_txn_state, f"{NOT_IN_TXN_MESSAGE} ({topic}-{partition})"
    if broker.txn.owner_error(transactional_id) is ErrorCode.not_coordinator and leader is not None:
        raise _VerifyRemotely(
            partition,
            header.producer_id,
            header.producer_epoch,
            broker.txn_verifier.guard(tp, header.producer_id, header.producer_epoch, leader),
        )
    result = broker.txn.coordinator.verify_partitions_in_txn(
        transactional_id,
        header.producer_id,
        header.producer_epoch,
        [tp],
        request_version=4,
    )
    return produce_error(result.error, tp)
