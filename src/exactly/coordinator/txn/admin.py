"""Read-only scans of the coordinator's metadata: DescribeTransactions, ListTransactions (KIP-664)
and the selections behind the periodic timeout and expiry tasks.

Pure functions over the metadata map, kept out of the coordinator so that the state machine module
holds only transitions. Nothing here changes state.

An id whose tombstone is being written (pending ``Dead``) is reported as not found, like Kafka
does for ``Dead``: it is on its way out and must not be resurrected by a tool.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping

from kio.schema.errors import ErrorCode

from exactly.coordinator.txn.effects import DescribedTransaction, ListedTransaction, ListTransactionsResult
from exactly.coordinator.txn.metadata import TransactionMetadata
from exactly.coordinator.txn.state import TransactionState

E = ErrorCode


def _is_dead(md: TransactionMetadata) -> bool:
    return md.state is TransactionState.DEAD or md.pending_state is TransactionState.DEAD


def describe(
    txns: Mapping[str, TransactionMetadata], transactional_id: str, *, loading: bool
) -> DescribedTransaction:
    """One DescribeTransactions entry (TRANSACTIONAL_ID_NOT_FOUND for unknown or expiring ids)."""
    if loading:
        return DescribedTransaction(E.coordinator_load_in_progress, transactional_id)
    if not transactional_id:
        return DescribedTransaction(E.invalid_request, transactional_id)
    md = txns.get(transactional_id)
    if md is None or _is_dead(md):
        return DescribedTransaction(E.transactional_id_not_found, transactional_id)
    return DescribedTransaction(
        error=E.none,
        transactional_id=transactional_id,
        state=md.state.state_name,
        transaction_timeout_ms=md.txn_timeout_ms,
        transaction_start_time_ms=md.txn_start_timestamp,
        producer_id=md.producer_id,
        producer_epoch=md.producer_epoch,
        partitions=tuple(sorted(md.partitions, key=lambda tp: (tp.topic, tp.partition))),
    )


def list_transactions(
    txns: Iterable[TransactionMetadata],
    *,
    now_ms: int,
    loading: bool,
    state_filters: Iterable[str] = (),
    producer_id_filters: Iterable[int] = (),
    duration_filter_ms: int = -1,
    transactional_id_pattern: str | None = None,
) -> ListTransactionsResult:
    """ListTransactions: every filter given must match; an empty filter matches everything.

    * ``state_filters``: Kafka state names; unknown names are echoed in
      ``unknown_state_filters`` and match nothing.
    * ``duration_filter_ms`` (KIP-994): if >= 0, only transactions running longer than it
      (``now - start > duration``); an id with no transaction started never matches.
    * ``transactional_id_pattern`` (ListTransactions v2): a regular expression that must match
      the whole id (Java ``Matcher.matches``); None or empty matches all. Python's ``re``
      dialect is close to, not identical with, Java's.
    """
    if loading:
        return ListTransactionsResult(E.coordinator_load_in_progress)
    state_names = tuple(state_filters)
    states: set[TransactionState] = set()
    unknown: list[str] = []
    for name in state_names:
        state = TransactionState.from_name(name)
        if state is None:
            unknown.append(name)
        else:
            states.add(state)
    producer_ids = set(producer_id_filters)
    try:
        pattern = re.compile(transactional_id_pattern) if transactional_id_pattern else None
    except re.error:
        return ListTransactionsResult(E.invalid_request, tuple(unknown))

    def include(md: TransactionMetadata) -> bool:
        if _is_dead(md):
            return False
        if producer_ids and md.producer_id not in producer_ids:
            return False
        if state_names and md.state not in states:
            return False
        if duration_filter_ms >= 0 and (
            md.txn_start_timestamp < 0 or now_ms - md.txn_start_timestamp <= duration_filter_ms
        ):
            return False
        return pattern is None or pattern.fullmatch(md.transactional_id) is not None

    listed = tuple(
        ListedTransaction(md.transactional_id, md.producer_id, md.state.state_name)
        for md in sorted(txns, key=lambda m: m.transactional_id)
        if include(md)
    )
    return ListTransactionsResult(E.none, tuple(unknown), listed)


def timed_out(txns: Iterable[TransactionMetadata], now_ms: int) -> Iterator[TransactionMetadata]:
    """Open transactions past their timeout and not already being changed.

    Two-phase-commit transactions (KIP-939) are never timed out: their outcome belongs to the
    external transaction manager that prepared them, which may decide long after the producer died.

    Strictly older than ``start + timeout``, as in Kafka; a transaction whose ``PrepareAbort``
    append is in flight is skipped and picked up again on the next scan if that append fails.
    """
    for md in tuple(txns):
        if (
            md.state is TransactionState.ONGOING
            and md.pending_state is None
            and not md.is_two_phase_commit  # KIP-939: only the external coordinator decides
            and md.txn_start_timestamp + md.txn_timeout_ms < now_ms
        ):
            yield md


def expirable(txns: Iterable[TransactionMetadata], now_ms: int, ttl_ms: int) -> Iterator[TransactionMetadata]:
    """Ids with no transaction in flight whose last update is at least ``ttl_ms`` old."""
    for md in tuple(txns):
        if (
            md.state.expiration_allowed
            and md.pending_state is None
            and md.txn_last_update_timestamp <= now_ms - ttl_ms
        ):
            yield md
