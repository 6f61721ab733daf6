"""Offsets per topic-partition: the source's position, how it is queried, and how it is rationed.

A source offset is a JSON-friendly dict ``{"topic": {"0": 23, "1": 42}}`` - the same shape as
Spark's Kafka source, so checkpoints are readable and ``startingOffsets`` JSON can be pasted from
one. An entry is the *next* offset to read; a micro-batch covers ``[start, end)`` per partition.

Under ``read_committed`` the end of a partition is its **last stable offset** (ListOffsets with
isolation_level=1): the first offset of the oldest open transaction, or the high watermark when
none is open. Planning never goes past it, so a micro-batch never includes records of a transaction
that might still abort, and replaying the batch after a crash reads exactly the same records.

Everything here runs on the driver (``OffsetClient`` holds an AdminClient and is never pickled).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from exactly.spark.options import EARLIEST, LATEST, OffsetSpecOption, SourceOptions, Subscription
from exactly.spark.retries import call_retrying

TP = tuple[str, int]
OffsetMap = dict[TP, int]


def to_json_offsets(offsets: Mapping[TP, int]) -> dict[str, dict[str, int]]:
    """``{(topic, p): off}`` -> ``{"topic": {"p": off}}`` with sorted keys (stable checkpoints)."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = int(offset)
    return out


def from_json_offsets(data: Mapping[str, Any] | None) -> OffsetMap:
    out: OffsetMap = {}
    for topic, parts in (data or {}).items():
        for partition, offset in parts.items():
            out[(str(topic), int(partition))] = int(offset)
    return out


def rate_limit(start: Mapping[TP, int], end: Mapping[TP, int], limit: int) -> OffsetMap:
    """Cap ``end`` so that at most ``limit`` offsets are admitted, shared in proportion to each
    partition's backlog (Spark's KafkaMicroBatchStream.rateLimit rule, so both connectors split a
    trigger the same way). Every partition with a backlog advances by at least one offset."""
    sizes = {tp: max(0, end[tp] - start.get(tp, end[tp])) for tp in end}
    total = sum(sizes.values())
    if total <= limit:
        return dict(end)
    capped: OffsetMap = {}
    for tp, until in end.items():
        begin = start.get(tp, until)
        size = sizes[tp]
        if size == 0:
            capped[tp] = until
            continue
        share = limit * (size / total)
        step = math.ceil(share) if size - share < 1 else math.floor(share)
        capped[tp] = min(until, begin + max(1, step))
    return capped


def _spec(kind: str) -> Any:
    """``OffsetSpec.earliest()`` / ``.latest()`` (untyped in confluent-kafka)."""
    return getattr(OffsetSpec, kind)()


class OffsetClient:
    """Driver-side metadata and ListOffsets queries (AdminClient), with retries and a deadline."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._admin = AdminClient({**options.client, "log_level": "3"})
        self._timeout = options.metadata_timeout_s

    # ------------------------------------------------------------ partitions
    def topic_partitions(self, subscription: Subscription | None = None) -> list[TP]:
        """The topic-partitions the subscription covers right now (sorted)."""
        sub = subscription or self.options.subscription
        if sub.assignment:
            return sorted(sub.assignment)
        metadata = call_retrying(
            lambda: self._admin.list_topics(timeout=self._timeout), self._timeout, "metadata"
        )
        found: list[TP] = []
        for name, topic in metadata.topics.items():
            if topic.error is not None or not sub.matches(name):
                continue
            found.extend((name, p) for p in topic.partitions)
        if sub.topics:
            missing = sorted(set(sub.topics) - {t for t, _ in found})
            if missing:
                raise KafkaException(f"subscribed topics do not exist: {', '.join(missing)}")
        return sorted(found)

    # ------------------------------------------------------------ offsets
    def earliest(self, tps: Iterable[TP]) -> OffsetMap:
        return self._list(tps, _spec("earliest"), committed=False)

    def latest(self, tps: Iterable[TP]) -> OffsetMap:
        """End offsets: the LSO under read_committed, else the high watermark."""
        return self._list(tps, _spec("latest"), committed=self.options.read_committed)

    def resolve(self, spec: OffsetSpecOption, tps: Iterable[TP], *, default: int) -> OffsetMap:
        """Turn earliest/latest/JSON (with -2/-1 entries) into concrete offsets for ``tps``."""
        tps = list(tps)
        wanted = {tp: spec.for_partition(tp[0], tp[1], default) for tp in tps}
        need_earliest = [tp for tp, o in wanted.items() if o == EARLIEST]
        need_latest = [tp for tp, o in wanted.items() if o == LATEST]
        earliest = self.earliest(need_earliest) if need_earliest else {}
        latest = self.latest(need_latest) if need_latest else {}
        return {tp: earliest.get(tp, latest.get(tp, o)) for tp, o in wanted.items()}

    def _list(self, tps: Iterable[TP], spec: Any, *, committed: bool) -> OffsetMap:
        request = {TopicPartition(t, p): spec for t, p in tps}
        if not request:
            return {}
        level = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED

        def query() -> OffsetMap:
            futures = self._admin.list_offsets(request, isolation_level=level, request_timeout=self._timeout)
            return {(tp.topic, tp.partition): fut.result(self._timeout).offset for tp, fut in futures.items()}

        # a partition whose leader moves answers NOT_LEADER / OFFSET_NOT_AVAILABLE for a while
        return call_retrying(query, self._timeout, "ListOffsets")
