"""A follower's steady-state Fetch answer read in one pass over the frame, against the request it
answers: a fast path beside ``exactly.protocol.fetch_response.parse_fetch_response``.

Why: at RF 3 every replicated message costs each follower one Fetch answer, read inside the
channel's receive callback (``LeaderFetcher._on_frame``). The generic reader walks the answer field
by field (varints, tagged-field sections, a ``FetchedPartition`` per partition), then the fetcher
looks every partition up again by a new ``TopicPartition`` (``partitions``, ``sent epochs``, the log
manager: a Python-level hash each) and once more to append. With the next request refilled from the
plan (``LeaderFetcher._take_planned``), a one-record answer costs ~36 µs of follower CPU instead of ~55
(``bench/follower_answer_micro.py``, ``bench/results/rf3p99-s19.md``). The fetcher
knows what the answer must look like: the partitions of the request in flight, in the order the
request wrote them. ``ResponsePlan`` is that list, built with the request template, holding each
partition's ``FollowedPartition`` and log; ``read_planned`` checks the frame against it
with a few fixed-layout reads.

Contract: ``read_planned`` changes nothing. It returns, per planned partition in order, (partition,
high watermark, records start, records end) only when the frame is exactly a plain answer to that
request: Fetch v12, the expected correlation id, no header/partition/topic/response tags (so no
DivergingEpoch), no error anywhere, no aborted transactions (null or empty: the follower reads
read_uncommitted, the leader writes null), the planned topics and partitions in the planned order.
Anything else gives None and the generic reader decides (including what to do with a malformed
frame). The caller then checks that each planned partition is still the one followed, in the epoch
asked, with the same log (``LeaderFetcher._on_frame``), as the generic path's checks; the appends
and the next request are the generic path's own functions.
Equivalence: tests/server/test_follower_response_fast.py.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exactly.protocol.primitives import WireFormatError, read_uvarint
from exactly.types import TopicPartition

if TYPE_CHECKING:
    from exactly.server.replica_truncation import FollowedPartition
    from exactly.storage.partition_log import PartitionLog

_HEAD = struct.Struct(">iBihiB")  # correlation id, header tags, throttle, error, session id, topics + 1
# index, error, high watermark, last stable offset, log start, aborted transactions (compact
# count + 1, 0 = null), preferred read replica
_PART = struct.Struct(">ihqqqBi")


@dataclass(frozen=True, slots=True)
class PlannedPartition:
    """One partition of the Fetch in flight: what the fetcher asked, and for whom."""

    tp: TopicPartition
    followed: FollowedPartition
    plog: PartitionLog


@dataclass(frozen=True, slots=True)
class ResponsePlan:
    """The partitions of a request template, in the order the request writes them: topics grouped
    in first-seen order (``LeaderFetcher._new_template``), each name as encoded bytes."""

    topics: tuple[tuple[bytes, tuple[PlannedPartition, ...]], ...]

    @classmethod
    def of(cls, partitions: list[PlannedPartition]) -> ResponsePlan:
        by_topic: dict[str, list[PlannedPartition]] = {}
        for planned in partitions:
            by_topic.setdefault(planned.tp.topic, []).append(planned)
        return cls(tuple((name.encode("utf-8"), tuple(parts)) for name, parts in by_topic.items()))


# what ``read_planned`` found: (partition, high watermark, records start, records end)
PlannedAnswer = tuple[PlannedPartition, int, int, int]


def read_planned(frame: bytearray, plan: ResponsePlan, correlation_id: int) -> list[PlannedAnswer] | None:
    """The plain answer to ``plan``'s request read in place, or None (see the module docstring)."""
    try:
        corr, header_tags, _throttle, error, _session, topics = _HEAD.unpack_from(frame, 0)
        if corr != correlation_id or header_tags or error or topics != len(plan.topics) + 1:
            return None
        pos = _HEAD.size
        end = len(frame)
        out: list[PlannedAnswer] = []
        for name, parts in plan.topics:
            n = len(name)
            # one-byte compact lengths only (a longer name or array is not the steady state)
            if frame[pos] != n + 1 or frame[pos + 1 : pos + 1 + n] != name:
                return None
            pos += 1 + n
            if frame[pos] != len(parts) + 1:
                return None
            pos += 1
            for planned in parts:
                index, code, hw, _lso, _log_start, aborted, _preferred = _PART.unpack_from(frame, pos)
                if index != planned.tp.partition or code or aborted > 1:
                    return None
                size, pos = read_uvarint(frame, pos + _PART.size)
                start = pos
                pos += max(size - 1, 0)  # 0: null records, nothing
                if pos >= end or frame[pos]:  # past the frame, or partition tags (DivergingEpoch)
                    return None
                out.append((planned, hw, start, pos))
                pos += 1
            if frame[pos]:  # topic tags
                return None
            pos += 1
        if pos + 1 != end or frame[pos]:  # response tags, then nothing
            return None
    except (struct.error, IndexError, WireFormatError):
        return None
    return out


def still_planned(
    answers: list[PlannedAnswer],
    partitions: Mapping[TopicPartition, FollowedPartition],
    sent_epochs: Mapping[TopicPartition, int],
    get_partition: Callable[[TopicPartition], PartitionLog | None],
) -> bool:
    """The generic ``_on_frame``'s checks for a planned answer: each partition still followed by
    the same ``FollowedPartition`` (``partitions``), not stopped or truncating, in the epoch it was
    asked in (``sent_epochs``), with the same log."""
    for planned, _hw, _start, _end in answers:
        followed = planned.followed
        tp = planned.tp
        if (
            partitions.get(tp) is not followed
            or followed.failed
            or followed.truncating
            or sent_epochs.get(tp) != followed.leader_epoch
            or get_partition(tp) is not planned.plog
        ):
            return False
    return True


__all__ = ["PlannedAnswer", "PlannedPartition", "ResponsePlan", "read_planned", "still_planned"]
