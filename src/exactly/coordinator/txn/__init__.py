"""Transaction coordinator (KIP-98): sans-IO state machine, metadata, and ``__transaction_state`` codec.

See README.md in this folder for how the coordinator runtime drives it.
"""

from exactly.coordinator.txn.config import TxnCoordinatorConfig
from exactly.coordinator.txn.coordinator import TransactionCoordinator
from exactly.coordinator.txn.effects import (
    AddOffsetsResult,
    AddPartitionsResult,
    AppendPurpose,
    AppendTxnLog,
    DescribedTransaction,
    EndTxnResult,
    InitProducerIdResult,
    ListedTransaction,
    ListTransactionsResult,
    Response,
    WriteMarkers,
)
from exactly.coordinator.txn.log import (
    CONSUMER_OFFSETS_TOPIC,
    TRANSACTION_STATE_TOPIC,
    offsets_partition_for,
    partition_for,
)
from exactly.coordinator.txn.metadata import TransactionMetadata, TxnTransitMetadata
from exactly.coordinator.txn.responses import append_error_to_coordinator_error
from exactly.coordinator.txn.state import InvalidTransitionError, TransactionState

__all__ = [
    "CONSUMER_OFFSETS_TOPIC",
    "TRANSACTION_STATE_TOPIC",
    "AddOffsetsResult",
    "AddPartitionsResult",
    "AppendPurpose",
    "AppendTxnLog",
    "DescribedTransaction",
    "EndTxnResult",
    "InitProducerIdResult",
    "InvalidTransitionError",
    "ListTransactionsResult",
    "ListedTransaction",
    "Response",
    "TransactionCoordinator",
    "TransactionMetadata",
    "TransactionState",
    "TxnCoordinatorConfig",
    "TxnTransitMetadata",
    "WriteMarkers",
    "append_error_to_coordinator_error",
    "offsets_partition_for",
    "partition_for",
]
