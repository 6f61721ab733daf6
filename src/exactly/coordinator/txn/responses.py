"""Error-code rules and the responses owed when an append finishes.

Kept apart from the state machine because they are pure functions of (purpose, version, error):
which error a client of a given request version understands, and how a failed
``__transaction_state`` append is reported.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from exactly.coordinator.txn.effects import (
    AddOffsetsResult,
    AddPartitionsResult,
    AppendPurpose,
    AppendTxnLog,
    EndTxnResult,
    InitProducerIdResult,
    Response,
)

E = ErrorCode

# Newest request versions modelled; a request without a version is treated as the newest.
INIT_PRODUCER_ID_VERSION = 6
ADD_PARTITIONS_VERSION = 5
ADD_OFFSETS_VERSION = 4
END_TXN_VERSION = 4

_INIT_PURPOSES = (AppendPurpose.INIT_PRODUCER_ID, AppendPurpose.FENCE, AppendPurpose.KEEP_PREPARED)


def append_error_to_coordinator_error(error: ErrorCode) -> ErrorCode:
    """Map a ``__transaction_state`` append error to what the client is told (Kafka's mapping).

    Replication/timeout trouble is retriable at the same coordinator; losing the partition means
    the client must find the coordinator again; an oversized record is a server bug.
    """
    if error in (
        E.unknown_topic_or_partition,
        E.not_enough_replicas,
        E.not_enough_replicas_after_append,
        E.request_timed_out,
    ):
        return E.coordinator_not_available
    if error in (E.not_leader_or_follower, E.kafka_storage_error):
        return E.not_coordinator
    if error in (E.message_too_large, E.record_list_too_large):
        return E.unknown_server_error
    return error


def compat_error(error: ErrorCode, purpose: AppendPurpose, version: int) -> ErrorCode:
    """PRODUCER_FENCED(90) exists from InitProducerId v4, AddPartitionsToTxn v2, AddOffsetsToTxn v2
    and EndTxn v2 on (KIP-588); older clients get INVALID_PRODUCER_EPOCH(47), as Kafka does.

    ``version`` < 0 means "no request" (internal appends) and leaves the error alone.
    """
    if error != E.producer_fenced or version < 0:
        return error
    first_version = 4 if purpose in _INIT_PURPOSES else 2
    return E.invalid_producer_epoch if version < first_version else error


def response_for_append(append: AppendTxnLog, error: ErrorCode) -> Response | None:
    """The response owed to the request behind ``append`` once it finished with ``error``.

    None for internal appends (timeouts, completions, expiry): nobody is waiting.
    """
    purpose = append.purpose
    error = compat_error(error, purpose, append.request_version)
    transit = append.transit
    ok = error == E.none
    if purpose is AppendPurpose.INIT_PRODUCER_ID:
        if ok:
            return InitProducerIdResult(E.none, transit.producer_id, transit.producer_epoch)
        return InitProducerIdResult(error)
    if purpose is AppendPurpose.KEEP_PREPARED:
        # The kept transaction was written under the epoch the transit remembers as the last one.
        if ok:
            return InitProducerIdResult(
                E.none,
                transit.producer_id,
                transit.producer_epoch,
                transit.producer_id,
                transit.last_producer_epoch,
            )
        return InitProducerIdResult(error)
    if purpose is AppendPurpose.FENCE:
        # The abort of the old instance's transaction is under way: retry once it completes.
        return InitProducerIdResult(E.concurrent_transactions if ok else error)
    if purpose is AppendPurpose.ADD_PARTITIONS:
        return AddPartitionsResult.uniform(append.requested_partitions, error)
    if purpose is AppendPurpose.ADD_OFFSETS:
        return AddOffsetsResult(error)
    if purpose is AppendPurpose.END_TXN:
        if ok:
            return EndTxnResult(E.none, transit.producer_id, transit.producer_epoch)
        return EndTxnResult(error)
    return None
