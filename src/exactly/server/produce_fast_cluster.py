"""The common Produce at a cluster leader, answered without the generic coroutine path.

Why: ``produce_fast`` declines every cluster broker, so each RF 3 Produce took the generic path
(the request parsers' objects, a handler coroutine, and, on a connection, a wake of its request
task: a loop turn the leader waits for a core for; bench/results/rf3tail-s18.md traced that hop
at 0.25 ms p50, 1 ms in the slowest 1% of acks=all acks). This path takes the same shape
(``produce_fast.read_common_produce``: v9+, no transactional id, acks 1 or -1, one topic, one
partition, one plain idempotent or non-idempotent v2 batch that validates) and calls the generic
path's own rules, in its order:

1. ``ReplicaManager.leader_for_write``: the topic and partition are known and this broker leads
   the partition now (else UNKNOWN_TOPIC_OR_PARTITION / NOT_LEADER_OR_FOLLOWER: declined);
2. ``LeaderPartition.check_before_append``: acks=-1 with the ISR below min.insync.replicas
   (NOT_ENOUGH_REPLICAS: declined);
3. ``PartitionLog.append_plain`` at the leader's epoch (declined, nothing written, for a
   duplicate, a producer-state error, LogAppendTime, a batch over max.message.bytes);
4. ``Broker.after_append`` (as ``LeaderReplicas.leader_appended``, with the leader of step 1:
   nothing awaits in between, so it still leads): the leader's LEO, the HW for an ISR of one,
   parked follower Fetches and consumers woken (``broker.waiters``), delayed produces completed;
5. acks=1: the answer at once. acks=-1: ``check_acks_all`` as the handler's ``_record``, and a
   wait that must happen goes to the same DelayedProduce (``park_for_acks``), whose completion
   resolves a ``PendingAnswer`` the connection writes within that call (the same ``Deferred``
   the generic handler returns). A caller that cannot take a deferred answer (``may_defer``
   False) is declined before anything changes.

Contract, as ``produce_fast``: either the request is answered completely (the bytes, counters,
log, leader and follower state and delayed-produce completion the generic path gives) or None is
returned having changed nothing, and the generic path answers it (every error the fast path
does not produce itself: an authorizer, an internal topic, a transactional batch, any check
above failing). The only errors it answers are the ones after the append, which the generic
path answers the same way: NOT_ENOUGH_REPLICAS_AFTER_APPEND and a DelayedProduce's own outcome
(REQUEST_TIMED_OUT, NOT_LEADER_OR_FOLLOWER...). Equivalence: tests/server/test_produce_fast_cluster.py.
"""

from __future__ import annotations

import struct
from functools import partial
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import ApiKey
from exactly.replication.leader import AckOutcome
from exactly.server.deferred_response import Deferred, PendingAnswer
from exactly.server.delayed_produce import Parked
from exactly.server.produce_fast import pack_answer, read_common_produce, response_layout
from exactly.topics import INTERNAL_TOPICS
from exactly.types import TopicPartition

if TYPE_CHECKING:
    from exactly.replication.leader import LeaderPartition
    from exactly.server.broker import Broker
    from exactly.server.replica_manager import ReplicaManager

_PRODUCE = int(ApiKey.PRODUCE)
_NONE = ErrorCode.none
_WAIT = AckOutcome.WAIT
_DONE = AckOutcome.DONE
_AFTER_APPEND = ErrorCode.not_enough_replicas_after_append

Answer = list[bytes] | Deferred[list[bytes] | None]


class ClusterFastProduce:
    """One cluster broker's fast path for the common Produce it leads. Caches, per (topic,
    partition), the ``TopicPartition`` and the answer's struct; the log is looked up per request
    (``Broker.partition``, as the generic path) since a leader's log changes with its roles."""

    __slots__ = ("_broker", "_layouts")

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._layouts: dict[tuple[str, int], tuple[TopicPartition, struct.Struct, bytes]] = {}

    def answer(self, payload: bytearray, now_ms: int, may_defer: bool) -> Answer | None:
        """The framed answer (or its ``Deferred``) of a common Produce this broker leads; None:
        not one, nothing changed."""
        broker = self._broker
        replicas = broker.replicas
        if replicas is None or broker.authorizer is not None:
            return None
        common = read_common_produce(payload)
        if common is None:
            return None
        correlation_id, acks, timeout_ms, name, index, start, stop, fields = common
        if acks == -1 and not may_defer:
            return None  # the generic handler awaits the ISR in place
        if name in INTERNAL_TOPICS:
            return None
        layout = self._layouts.get((name, index))
        if layout is None:
            if len(self._layouts) > 4096:  # topics come and go: keep the cache bounded
                self._layouts.clear()
            layout = (TopicPartition(name, index), *response_layout(name))
            self._layouts[(name, index)] = layout
        tp, shape, prefix = layout
        plog = broker.logs.get_partition(tp)
        # handlers.produce._append's checks, in its order (leadership, then min.insync.replicas)
        _code, leader = replicas.leader_for_write(tp)
        if leader is None or plog is None:
            return None
        min_isr = plog.config.min_insync_replicas
        if leader.check_before_append(acks, min_isr) is not _NONE:
            return None
        with memoryview(payload) as view:
            records = view[start:stop]
            try:
                base_offset = plog.append_plain(records, fields, now_ms, leader.leader_epoch)
            except OSError:
                return None  # not written (write_whole cut the file back): the generic path reports it
            finally:
                records.release()
        if base_offset is None:
            return None
        log_start = plog.log_start_offset  # the generic answer's AppendResult takes it here
        metrics = broker.metrics
        metrics.requests[_PRODUCE] += 1
        metrics.messages_in += fields[12]
        # Broker.after_append, with the leader looked up above: no await since, so it still leads
        replicas.leading.leader_appended(plog, leader)
        if acks == 1:
            return [pack_answer(metrics, shape, prefix, correlation_id, index, _NONE, base_offset, log_start)]
        # acks=-1: handlers.produce._record's tryCompleteElseWatch (which looks the leader up
        # again: the same object here, since nothing since leader_for_write awaited)
        required = base_offset + fields[6] + 1
        outcome = leader.check_acks_all(required, min_isr)
        if outcome is _DONE:
            return [pack_answer(metrics, shape, prefix, correlation_id, index, _NONE, base_offset, log_start)]
        if outcome is not _WAIT:  # NOT_ENOUGH_REPLICAS_AFTER_APPEND
            metrics.error(_PRODUCE, _AFTER_APPEND)
            return [pack_answer(metrics, shape, prefix, correlation_id, index, _AFTER_APPEND, -1, -1)]
        return Deferred(
            self._park(
                replicas,
                tp,
                leader,
                shape,
                prefix,
                correlation_id,
                index,
                base_offset,
                log_start,
                required,
                min_isr,
                timeout_ms,
            )
        )

    def _park(
        self,
        replicas: ReplicaManager,
        tp: TopicPartition,
        leader: LeaderPartition,
        shape: struct.Struct,
        prefix: bytes,
        correlation_id: int,
        index: int,
        base_offset: int,
        log_start: int,
        required: int,
        min_isr: int,
        timeout_ms: int,
    ) -> PendingAnswer[list[bytes] | None]:
        """The DelayedProduce of ``handlers.produce._answer_when_replicated`` for one partition:
        resolved with the framed answer by whatever completes it (the follower Fetch that moves
        the HW, a role change, the timeout); cancelled (the connection is gone) it is discarded."""
        answer: PendingAnswer[list[bytes] | None] = PendingAnswer()
        metrics = self._broker.metrics

        def settle(code: ErrorCode) -> None:
            if code != _NONE:
                metrics.error(_PRODUCE, code)
                frame = pack_answer(metrics, shape, prefix, correlation_id, index, code, -1, -1)
            else:
                frame = pack_answer(
                    metrics, shape, prefix, correlation_id, index, _NONE, base_offset, log_start
                )
            answer.set_result([frame])

        entry = replicas.park_for_acks(tp, leader, required, min_isr, timeout_ms / 1000, settle)
        if isinstance(entry, Parked):
            answer.on_cancel(partial(replicas.delayed_produces.discard, entry))
        else:
            settle(entry)
        return answer


__all__ = ["ClusterFastProduce"]
