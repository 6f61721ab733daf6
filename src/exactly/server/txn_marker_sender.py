"""Cluster mode: the transaction coordinator's COMMIT/ABORT markers, sent to each data partition's
current leader (Kafka's ``TransactionMarkerChannelManager``), and the leader's side of them.

Why a module of its own: on a single broker a marker is a local append (``InternalTopics.
write_marker``); on a cluster the partitions of one transaction are led by several brokers, which
may change while the markers are on their way. :meth:`TxnMarkerSender.send` therefore loops until
every partition has its marker: partitions are grouped by their leader in the metadata cache; the
ones this broker leads are appended locally with acks=all, the others go in one WriteTxnMarkers
(API 27, v1) per leader over a broker-to-broker connection. Per partition, the answer decides
(Kafka's ``TransactionMarkerRequestCompletionHandler``):

* NONE: done;
* the leader is moving or the ISR is short (NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS*,
  REQUEST_TIMED_OUT, KAFKA_STORAGE_ERROR, no live leader, a lost connection, and
  UNKNOWN_TOPIC_OR_PARTITION while the cluster still has the partition): look the leader up
  again and retry after ``RETRY_BACKOFF_S``;
* the partition is gone from the cluster (deleted topic): nothing to complete there;
* the partition moved past this transaction (INVALID_PRODUCER_EPOCH, PRODUCER_FENCED) or a newer
  coordinator wrote there (TRANSACTION_COORDINATOR_FENCED): stop sending to it (retrying
  cannot help; Kafka stops too);
* anything else is logged and the partition is given up, as Kafka treats it as a bug.

The coordinator epoch written into every marker is the leader epoch of the transaction's
``__transaction_state`` partition when this broker loaded it (Kafka's rule): a later coordinator
always has a higher one, so a partition leader refuses the markers of an older one
(TRANSACTION_COORDINATOR_FENCED, checked by the partition's producer state).

:func:`write_local_marker` is the leader's side, shared with the WriteTxnMarkers handler: the
acks=all append and, on ``__consumer_offsets``, the group coordinator's completion of the
transaction's pending offsets.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode
from kio.schema.types import ProducerId, TopicName
from kio.schema.write_txn_markers.v1 import request as markers_request
from kio.static.primitive import i16, i32

from exactly.coordinator.txn.effects import WriteMarkers
from exactly.records.control import ControlType
from exactly.server.broker_connection import BrokerConnection
from exactly.server.inter_broker import failure_level
from exactly.server.internal_topics import AppendFailed
from exactly.topics import CONSUMER_OFFSETS_TOPIC
from exactly.types import TopicPartition

if TYPE_CHECKING:
    from exactly.server.broker import Broker

log = logging.getLogger("exactly.txn_markers")

RETRY_BACKOFF_S = 0.1

_RETRY = frozenset(
    {
        ErrorCode.not_leader_or_follower,
        ErrorCode.not_enough_replicas,
        ErrorCode.not_enough_replicas_after_append,
        ErrorCode.request_timed_out,
        ErrorCode.kafka_storage_error,
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.coordinator_load_in_progress,
    }
)
_STOP = frozenset(
    {
        ErrorCode.invalid_producer_epoch,
        ErrorCode.producer_fenced,
        ErrorCode.transaction_coordinator_fenced,
    }
)


async def write_local_marker(
    broker: Broker,
    tp: TopicPartition,
    result: ControlType,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int,
) -> ErrorCode:
    """Append one marker as ``tp``'s leader, acknowledged by the ISR; tell the group
    coordinator when it completes a transaction's offsets. Returns the partition's error code."""
    broker.txn_verifier.on_marker(tp, producer_id)  # verifications answered before it are void
    try:
        await broker.internal.write_marker_replicated(
            tp, result, producer_id, producer_epoch, coordinator_epoch
        )
    except AppendFailed as exc:
        log.info("marker %s of producer %d on %s refused: %s", result.name, producer_id, tp, exc)
        return exc.error_code
    if tp.topic == CONSUMER_OFFSETS_TOPIC:
        await broker.groups.apply_marker(tp.partition, producer_id, result is ControlType.COMMIT)
    return ErrorCode.none


class TxnMarkerSender:
    """Sends markers to partition leaders (see the module docstring). Owns one connection per
    destination broker, reopened when the broker's endpoint changes; :meth:`close` drops them."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._connections: dict[int, BrokerConnection] = {}

    async def send(self, markers: WriteMarkers, coordinator_epoch: int) -> None:
        """Return once every partition of ``markers`` has its marker or was given up (see the
        module docstring). Cancelled when this broker stops coordinating the transaction."""
        pending = set(markers.partitions)
        while pending:
            by_leader: dict[int, list[TopicPartition]] = defaultdict(list)
            for tp in sorted(pending, key=lambda t: (t.topic, t.partition)):
                if not self._exists(tp):
                    log.info(
                        "%s is gone: no %s marker for %s", tp, markers.result.name, markers.transactional_id
                    )
                    pending.discard(tp)
                    continue
                leader = self._cache().leader(tp)
                if leader is not None:
                    by_leader[leader.broker_id].append(tp)
            for broker_id, tps in by_leader.items():
                outcome = await self._send_to(broker_id, tps, markers, coordinator_epoch)
                for tp, code in outcome.items():
                    if self._settled(tp, code, markers):
                        pending.discard(tp)
            if pending:
                await asyncio.sleep(RETRY_BACKOFF_S)

    def _settled(self, tp: TopicPartition, code: ErrorCode, markers: WriteMarkers) -> bool:
        if code == ErrorCode.none:
            return True
        if code in _RETRY:
            return False
        if code in _STOP:
            log.warning("marker for %s on %s not written: %s", markers.transactional_id, tp, code.name)
        else:
            log.error("marker for %s on %s failed: %s; giving up", markers.transactional_id, tp, code.name)
        return True

    async def _send_to(
        self, broker_id: int, tps: list[TopicPartition], markers: WriteMarkers, coordinator_epoch: int
    ) -> dict[TopicPartition, ErrorCode]:
        args = (markers.result, markers.producer_id, markers.producer_epoch, coordinator_epoch)
        if broker_id == self.broker.node_id:
            return {tp: await write_local_marker(self.broker, tp, *args) for tp in tps}
        by_topic: dict[str, list[int]] = defaultdict(list)
        for tp in tps:
            by_topic[tp.topic].append(tp.partition)
        request = markers_request.WriteTxnMarkersRequest(
            markers=(
                markers_request.WritableTxnMarker(
                    producer_id=ProducerId(markers.producer_id),
                    producer_epoch=i16(markers.producer_epoch),
                    transaction_result=markers.result is ControlType.COMMIT,
                    topics=tuple(
                        markers_request.WritableTxnMarkerTopic(
                            name=TopicName(topic), partition_indexes=tuple(i32(p) for p in parts)
                        )
                        for topic, parts in by_topic.items()
                    ),
                    coordinator_epoch=i32(coordinator_epoch),
                ),
            )
        )
        try:
            response = await self._connection(broker_id).call(request)
        except (OSError, EOFError, TimeoutError, ConnectionError, asyncio.IncompleteReadError) as exc:
            log.log(failure_level(exc), "markers to broker %d not sent: %s", broker_id, exc)
            return {tp: ErrorCode.not_leader_or_follower for tp in tps}
        outcome = {tp: ErrorCode.not_leader_or_follower for tp in tps}  # unanswered: retry
        for marker in response.markers:
            for topic in marker.topics:
                for part in topic.partitions:
                    tp = TopicPartition(str(topic.name), int(part.partition_index))
                    if tp in outcome:
                        outcome[tp] = ErrorCode(int(part.error_code))
        return outcome

    def _cache(self) -> Any:
        replicas = self.broker.replicas
        assert replicas is not None, "cluster mode only"
        return replicas.cache

    def _exists(self, tp: TopicPartition) -> bool:
        cached = self._cache().topic(tp.topic)
        return cached is not None and tp.partition in cached.assignment.partitions

    def _connection(self, broker_id: int) -> BrokerConnection:
        endpoint = self._cache().brokers.get(broker_id)
        conn = self._connections.get(broker_id)
        if conn is not None and conn.endpoint != endpoint:
            conn.close()
            conn = None
        if conn is None:
            if endpoint is None:
                raise ConnectionError(f"broker {broker_id} is not alive")
            conn = self._connections[broker_id] = BrokerConnection(
                endpoint, f"txn-markers-{self.broker.node_id}", self.broker.inter_broker
            )
        return conn

    def close(self) -> None:
        for conn in self._connections.values():
            conn.close()
        self._connections.clear()
