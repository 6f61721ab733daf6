"""A follower's truncation applied to its log (the I/O side of ``replication.truncation``, which
decides): the OffsetsForLeaderEpoch round of the TRUNCATING partitions and the cut a
DivergingEpoch answer asks for (truncation on fetch). Split from ``replica_fetcher``, which owns
the connection and calls these between its Fetches; its docstring describes the protocol.

Every cut goes through ``PartitionLog.truncate_to`` (log, epoch cache, producer state) and then
tells the partition's ``FollowerPartition`` the decision, so the state machine and the log never
disagree about whether a truncation completed. An answer asked in an older leader epoch, or for
a partition no longer truncating or followed, is ignored: the new epoch asks its own question.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode
from kio.schema.offset_for_leader_epoch.v3 import request as epoch_request
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i32

from exactly.replication.truncation import (
    FetchState,
    FollowerPartition,
    TruncationDecision,
    epoch_to_ask,
    truncation_offset,
)
from exactly.storage.leader_epoch import EpochEndOffset
from exactly.types import TopicPartition

if TYPE_CHECKING:
    from exactly.storage.log_manager import LogManager
    from exactly.storage.partition_log import PartitionLog

log = logging.getLogger("exactly.replica_fetcher")  # the fetcher's log lines, as before the split


@dataclass(slots=True)
class FollowedPartition:
    tp: TopicPartition
    state: FollowerPartition
    failed: bool = False  # stopped after an error, until the next role change

    @property
    def leader_epoch(self) -> int:
        return self.state.leader_epoch

    @property
    def truncating(self) -> bool:
        return self.state.state is FetchState.TRUNCATING


AskedFor = dict[TopicPartition, int]
"""The leader epoch each OffsetsForLeaderEpoch question was asked in (stale answers)."""


def epoch_questions(
    broker_id: int, truncating: list[FollowedPartition], logs: LogManager
) -> tuple[epoch_request.OffsetForLeaderEpochRequest | None, AskedFor]:
    """The OffsetsForLeaderEpoch request for every truncating partition that can ask (None: none
    can), and the epochs they asked in. A partition without any epoch cannot ask: it is cut to
    its high watermark here (Kafka's fallback)."""
    asks: dict[str, list[Any]] = {}
    asked_for: AskedFor = {}
    for followed in truncating:
        plog = logs.get_partition(followed.tp)
        if plog is None:
            continue
        epoch = epoch_to_ask(plog.leader_epochs.entries)
        if epoch is None:  # nothing to ask with: Kafka's fallback is the high watermark
            apply_truncation(followed, plog, TruncationDecision(plog.high_watermark, True))
            continue
        asked_for[followed.tp] = followed.leader_epoch
        asks.setdefault(followed.tp.topic, []).append(
            epoch_request.OffsetForLeaderPartition(
                partition=i32(followed.tp.partition),
                current_leader_epoch=i32(followed.leader_epoch),
                leader_epoch=i32(epoch),
            )
        )
    if not asks:
        return None, asked_for
    request = epoch_request.OffsetForLeaderEpochRequest(
        replica_id=BrokerId(broker_id),
        topics=tuple(
            epoch_request.OffsetForLeaderTopic(topic=TopicName(t), partitions=tuple(parts))
            for t, parts in asks.items()
        ),
    )
    return request, asked_for


def apply_epoch_answers(
    response: Any,
    asked_for: AskedFor,
    partitions: Mapping[TopicPartition, FollowedPartition],
    logs: LogManager,
) -> bool:
    """Cut each log the OffsetsForLeaderEpoch ``response`` answers for (complete, or asking
    again next round: KIP-279); True when a partition's error asks for a back-off (the leader
    moves on: wait for the next observed state)."""
    backoff = False
    for topic in response.topics:
        for part in topic.partitions:
            tp = TopicPartition(str(topic.topic), int(part.partition))
            current = partitions.get(tp)
            plog = logs.get_partition(tp)
            if current is None or plog is None or not current.truncating:
                continue
            if asked_for.get(tp) != current.leader_epoch:
                continue  # answered for an older epoch: ask again in the new one
            if int(part.error_code) != ErrorCode.none:
                backoff = True
                continue
            decision = truncation_offset(
                plog.leader_epochs.entries,
                EpochEndOffset(int(part.leader_epoch), int(part.end_offset)),
                log_end_offset=plog.log_end_offset,
                high_watermark=plog.high_watermark,
            )
            apply_truncation(current, plog, decision)
    return backoff


def apply_truncation(followed: FollowedPartition, plog: PartitionLog, decision: TruncationDecision) -> None:
    removed = plog.truncate_to(decision.offset)
    if removed:
        log.info(
            "%s: truncated to %d (%d bytes) for leader epoch %d",
            plog.tp,
            decision.offset,
            removed,
            followed.leader_epoch,
        )
    followed.state.on_truncated(decision, followed.leader_epoch)


def truncate_on_fetch(followed: FollowedPartition, plog: PartitionLog, diverging: tuple[int, int]) -> None:
    """The leader answered a DivergingEpoch (no records, nothing about our fetch recorded):
    the same rule as an OffsetsForLeaderEpoch answer; incomplete -> TRUNCATING (ask)."""
    decision = truncation_offset(
        plog.leader_epochs.entries,
        EpochEndOffset(*diverging),
        log_end_offset=plog.log_end_offset,
        high_watermark=plog.high_watermark,
    )
    removed = plog.truncate_to(decision.offset)
    log.info(
        "%s: truncated to %d (%d bytes) for leader epoch %d on fetch: diverging epoch %d ends at %d%s",
        plog.tp,
        decision.offset,
        removed,
        followed.leader_epoch,
        diverging[0],
        diverging[1],
        "" if decision.completed else ", asking OffsetsForLeaderEpoch",
    )
    followed.state.on_diverging_epoch(decision, followed.leader_epoch)


__all__ = [
    "FollowedPartition",
    "apply_epoch_answers",
    "apply_truncation",
    "epoch_questions",
    "truncate_on_fetch",
]
