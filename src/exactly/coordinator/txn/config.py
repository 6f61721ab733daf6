"""Broker settings of the transaction coordinator, with Kafka's names and defaults."""

from __future__ import annotations

from dataclasses import dataclass

from exactly.coordinator.txn.log import DEFAULT_NUM_PARTITIONS, DEFAULT_VALUE_VERSION

DAY_MS = 24 * 60 * 60 * 1000


@dataclass(frozen=True, slots=True)
class TxnCoordinatorConfig:
    """Immutable: change settings by building a new coordinator (and reloading), never in place.

    ``transaction_state_partitions`` must never change for an existing ``__transaction_state``:
    every transactional.id would map to another partition and lose its state.
    """

    transaction_max_timeout_ms: int = 15 * 60 * 1000  # transaction.max.timeout.ms
    transactional_id_expiration_ms: int = 7 * DAY_MS  # transactional.id.expiration.ms
    transaction_state_partitions: int = DEFAULT_NUM_PARTITIONS  # transaction.state.log.num.partitions
    offsets_topic_partitions: int = DEFAULT_NUM_PARTITIONS  # offsets.topic.num.partitions
    # How often the runtime should call expire_timed_out() (Kafka:
    # transaction.abort.timed.out.transaction.cleanup.interval.ms = 10 s) and
    # expire_transactional_ids() (transaction.remove.expired.transaction.cleanup.interval.ms = 1 h).
    abort_timed_out_interval_ms: int = 10_000
    remove_expired_transactional_ids_interval_ms: int = 60 * 60 * 1000
    # transaction.two.phase.commit.enable (KIP-939, default false as in Kafka): whether producers
    # may ask for two-phase-commit transactions (InitProducerId enable_2pc), which the coordinator
    # never aborts on a timeout and which a new InitProducerId with keep_prepared_txn keeps open.
    two_phase_commit_enable: bool = False
    # __transaction_state value version to write (0 = Kafka TV0/TV1 format, 1 = flexible, KIP-890).
    log_value_version: int = DEFAULT_VALUE_VERSION
