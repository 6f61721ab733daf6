"""KIP-890 part 1 at a partition leader whose transaction coordinator is another broker
(cluster mode): verify a producer's first transactional write to a partition with
AddPartitionsToTxn v4 ``verify_only`` sent to the coordinator, as Kafka 3.6+ does
(``AddPartitionsToTxnManager``, ``transaction.partition.verification.enable``).

Why: without it a write delayed past the end of its transaction (its markers already written)
would open a new "transaction" on the partition that no coordinator will ever end, holding the
last stable offset back for good -- the hanging transaction. When the coordinator is this broker
the produce path asks it directly (``handlers/produce.py``); this module is the remote case.

The race the guard closes (Kafka's ``VerificationGuard``): between the coordinator's "yes" and
the append, the transaction may end and its ABORT/COMMIT marker land here (a timeout abort, an
admin abort). So before asking, the leader registers a :class:`VerificationGuard` for
(partition, producer) under its current leadership; a marker written for that producer on that
partition removes it (:meth:`TxnVerifier.on_marker`), and the append after a successful
verification happens only if the same guard is still registered and the broker still leads the
partition with the same :class:`LeaderPartition` (:meth:`TxnVerifier.consume`). Requests of the
same producer in flight together share one guard. Invariant: a transactional batch is appended
only inside an open transaction of its producer here, or right after a verification that no
marker of that producer overtook.

Once appended, the producer has an open transaction on the partition, and its later writes
skip verification (the producer state says so) until the marker ends it: the cache per
(producer, partition) is the producer state itself, as on a single broker.

Errors as Kafka's ``ReplicaManager`` maps them for the producer: PRODUCER_FENCED ->
INVALID_PRODUCER_EPOCH; not in the transaction (INVALID_TXN_STATE, TRANSACTION_ABORTABLE,
INVALID_PRODUCER_ID_MAPPING) -> INVALID_TXN_STATE "Partition was not added to the transaction";
what the coordinator or the connection cannot answer yet (NOT_COORDINATOR,
COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS, CONCURRENT_TRANSACTIONS, a failed
connection) -> NOT_ENOUGH_REPLICAS, which every producer retries without a metadata refresh.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kio.schema.add_partitions_to_txn.v4 import request as verify_request
from kio.schema.errors import ErrorCode
from kio.schema.types import ProducerId, TopicName, TransactionalId
from kio.static.primitive import i16, i32

from exactly.server.broker_connection import BrokerConnections
from exactly.server.inter_broker import failure_level
from exactly.topics import TRANSACTION_STATE_TOPIC
from exactly.types import TopicPartition

if TYPE_CHECKING:
    from exactly.replication.leader import LeaderPartition
    from exactly.server.broker import Broker

log = logging.getLogger("exactly.txn_verification")

VERIFY_TIMEOUT_S = 10.0
NOT_IN_TXN_MESSAGE = "Partition was not added to the transaction"
_RETRY_LATER = frozenset(
    {
        ErrorCode.not_coordinator,
        ErrorCode.coordinator_not_available,
        ErrorCode.coordinator_load_in_progress,
        ErrorCode.concurrent_transactions,
        ErrorCode.network_exception,
    }
)
_NOT_IN_TXN = frozenset(
    {ErrorCode.invalid_txn_state, ErrorCode.transaction_abortable, ErrorCode.invalid_producer_id_mapping}
)


def produce_error(code: ErrorCode, tp: TopicPartition) -> tuple[ErrorCode, str] | None:
    """The Produce answer for a verification's result (None: verified)."""
    if code == ErrorCode.none:
        return None
    if code == ErrorCode.producer_fenced:
        return ErrorCode.invalid_producer_epoch, "producer epoch is fenced by a newer one"
    if code in _RETRY_LATER:
        return (
            ErrorCode.not_enough_replicas,
            f"Unable to verify the partition has been added to the transaction. Underlying error: {code.name}",
        )
    if code in _NOT_IN_TXN:
        return ErrorCode.invalid_txn_state, f"{NOT_IN_TXN_MESSAGE} ({tp.topic}-{tp.partition})"
    return code, f"transaction verification failed: {code.name}"


@dataclass(eq=False, slots=True)
class VerificationGuard:
    """Registered for (partition, producer) while a verification is on its way; identity is
    what counts (a new leadership or a marker makes a new one necessary)."""

    producer_epoch: int
    leader: LeaderPartition


class TxnVerifier:
    """The guards and the broker-to-broker connections of remote verification."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._guards: dict[tuple[TopicPartition, int], VerificationGuard] = {}
        self._connections: BrokerConnections | None = None

    # ---- guards -------------------------------------------------------------------------------
    def guard(
        self, tp: TopicPartition, producer_id: int, producer_epoch: int, leader: LeaderPartition
    ) -> VerificationGuard:
        """The guard for a verification about to be sent (shared with one already waiting for
        the same producer epoch under the same leadership)."""
        key = (tp, producer_id)
        guard = self._guards.get(key)
        if guard is None or guard.producer_epoch != producer_epoch or guard.leader is not leader:
            guard = self._guards[key] = VerificationGuard(producer_epoch, leader)
        return guard

    def consume(self, tp: TopicPartition, producer_id: int, guard: VerificationGuard) -> bool:
        """True (and the guard is spent) when ``guard`` still stands: no marker of the producer
        on ``tp`` since it was registered and the same leadership of ``tp``."""
        key = (tp, producer_id)
        replicas = self.broker.replicas
        if (
            self._guards.get(key) is not guard
            or replicas is None
            or replicas.leaders.get(tp) is not guard.leader
        ):
            return False
        del self._guards[key]
        return True

    def on_marker(self, tp: TopicPartition, producer_id: int) -> None:
        """A COMMIT/ABORT marker of ``producer_id`` is being written to ``tp``: verifications
        answered before it no longer hold."""
        self._guards.pop((tp, producer_id), None)

    def forget(self, tp: TopicPartition, producer_id: int, guard: VerificationGuard) -> None:
        """A verification failed: drop its guard unless another one replaced it."""
        if self._guards.get((tp, producer_id)) is guard:
            del self._guards[(tp, producer_id)]

    # ---- the request --------------------------------------------------------------------------
    async def verify(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
    ) -> dict[TopicPartition, ErrorCode]:
        """Ask the coordinator of ``transactional_id`` whether each partition is in the
        producer's ongoing transaction; one code per partition (NONE: it is)."""
        wanted = list(dict.fromkeys(partitions))
        replicas = self.broker.replicas
        assert replicas is not None, "cluster mode only"
        txn = self.broker.txn
        partition = txn.coordinator.partition_for(transactional_id)
        coordinator = replicas.cache.leader(TopicPartition(TRANSACTION_STATE_TOPIC, partition))
        if coordinator is None:
            return dict.fromkeys(wanted, ErrorCode.coordinator_not_available)
        if coordinator.broker_id == self.broker.node_id:
            # leadership moved here meanwhile: ask the local coordinator (as the produce path does)
            if txn.owner_error(transactional_id) is not ErrorCode.none:
                return dict.fromkeys(wanted, txn.owner_error(transactional_id))
            local = txn.coordinator.verify_partitions_in_txn(
                transactional_id, producer_id, producer_epoch, wanted, request_version=4
            )
            return {tp: code for tp, code in local.as_dict().items() if tp in wanted}
        by_topic: dict[str, list[int]] = defaultdict(list)
        for tp in wanted:
            by_topic[tp.topic].append(tp.partition)
        request = verify_request.AddPartitionsToTxnRequest(
            transactions=(
                verify_request.AddPartitionsToTxnTransaction(
                    transactional_id=TransactionalId(transactional_id),
                    producer_id=ProducerId(producer_id),
                    producer_epoch=i16(producer_epoch),
                    verify_only=True,
                    topics=tuple(
                        verify_request.AddPartitionsToTxnTopic(
                            name=TopicName(topic), partitions=tuple(i32(p) for p in parts)
                        )
                        for topic, parts in by_topic.items()
                    ),
                ),
            )
        )
        try:
            response = await self._connections_to().get(coordinator.broker_id).call(request)
        except (OSError, EOFError, TimeoutError, ConnectionError, asyncio.IncompleteReadError) as exc:
            log.log(
                failure_level(exc),
                "verification of %s at broker %d failed: %s",
                transactional_id,
                coordinator.broker_id,
                exc,
            )
            return dict.fromkeys(wanted, ErrorCode.network_exception)
        if response.error_code != ErrorCode.none:
            return dict.fromkeys(wanted, ErrorCode(int(response.error_code)))
        out = dict.fromkeys(wanted, ErrorCode.network_exception)  # unanswered: retry later
        for result in response.results_by_transaction:
            for topic in result.topic_results:
                for part in topic.results_by_partition:
                    tp = TopicPartition(str(topic.name), int(part.partition_index))
                    if tp in out:
                        out[tp] = ErrorCode(int(part.partition_error_code))
        return out

    def _connections_to(self) -> BrokerConnections:
        if self._connections is None:
            replicas = self.broker.replicas
            assert replicas is not None, "cluster mode only"
            self._connections = BrokerConnections(
                replicas.cache,
                f"txn-verification-{self.broker.node_id}",
                self.broker.inter_broker,
                VERIFY_TIMEOUT_S,
            )
        return self._connections

    def close(self) -> None:
        if self._connections is not None:
            self._connections.close()
        self._guards.clear()
