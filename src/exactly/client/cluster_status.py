"""The cluster's state as one broker's Metadata answer shows it (``exactly cluster status``).

What a Kafka operator reads from ``kafka-topics --describe`` and ``kafka-metadata-quorum`` /
``zookeeper-shell``, in one place and over the wire only (no ZooKeeper access needed): the live
brokers and their endpoints, the controller, every partition's leader, leader epoch, replicas and
ISR, which partitions are under-replicated or offline, and which broker is the group /
transaction coordinator of each ``__consumer_offsets`` / ``__transaction_state`` partition (the
coordinator of a partition is its leader).

Definitions (the same as the brokers' Prometheus gauges, so the counts add up):

* **offline**: no live leader (leader -1, or a leader not among the live brokers). Kafka's
  OfflinePartitionsCount, and ``kafka-topics --unavailable-partitions``.
* **under-replicated**: a live leader and an ISR smaller than the replica set. Kafka's
  UnderReplicatedPartitions as the leaders count it (an offline partition has no leader to count
  it, so the two sets are disjoint).

The view is the answering broker's metadata cache, which follows ZooKeeper by watches: a broker
killed a moment ago stays "live" until its ZooKeeper session expires
(``zookeeper.session.timeout.ms``), exactly as in Kafka's ZooKeeper mode.

``summarize`` is pure (it takes the Metadata answer's values); ``read_status`` does the one request.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from exactly.client.wire import ApiKey, WireClient, WireError, error_name
from exactly.coordinator.txn.log import offsets_partition_for, partition_for
from exactly.protocol.apis import build
from exactly.topics import CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC

__all__ = [
    "BrokerInfo",
    "ClusterStatus",
    "PartitionStatus",
    "RawPartition",
    "coordinator_of",
    "read_status",
    "render",
    "summarize",
]

METADATA_MAX_VERSION = 9  # v9 carries everything shown; later versions add only topic ids
NO_LEADER = -1
COORDINATOR_TOPICS = {CONSUMER_OFFSETS_TOPIC: "group", TRANSACTION_STATE_TOPIC: "transaction"}


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    broker_id: int
    host: str
    port: int

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class PartitionStatus:
    topic: str
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline_replicas: tuple[int, ...]
    offline: bool
    under_replicated: bool

    @property
    def coordinator_kind(self) -> str | None:
        """``group`` / ``transaction`` for a coordinator's partition, else None."""
        return COORDINATOR_TOPICS.get(self.topic)


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    cluster_id: str | None
    controller_id: int
    brokers: tuple[BrokerInfo, ...]  # live ones, by id
    partitions: tuple[PartitionStatus, ...]  # by topic, partition
    answered_by: str

    @property
    def under_replicated(self) -> tuple[PartitionStatus, ...]:
        return tuple(p for p in self.partitions if p.under_replicated)

    @property
    def offline(self) -> tuple[PartitionStatus, ...]:
        return tuple(p for p in self.partitions if p.offline)

    @property
    def missing_brokers(self) -> tuple[int, ...]:
        """Broker ids named as replicas but not alive."""
        live = {b.broker_id for b in self.brokers}
        return tuple(sorted({r for p in self.partitions for r in p.replicas} - live))

    def coordinators(self) -> dict[str, dict[int, int]]:
        """kind -> {partition -> coordinator broker (-1 while offline)}."""
        out: dict[str, dict[int, int]] = {}
        for p in self.partitions:
            kind = p.coordinator_kind
            if kind is not None:
                out.setdefault(kind, {})[p.partition] = NO_LEADER if p.offline else p.leader
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "cluster_id": self.cluster_id,
            "controller": self.controller_id,
            "answered_by": self.answered_by,
            "brokers": [{"id": b.broker_id, "host": b.host, "port": b.port} for b in self.brokers],
            "missing_brokers": list(self.missing_brokers),
            "partitions": [
                {
                    "topic": p.topic,
                    "partition": p.partition,
                    "leader": p.leader,
                    "leader_epoch": p.leader_epoch,
                    "replicas": list(p.replicas),
                    "isr": list(p.isr),
                    "offline_replicas": list(p.offline_replicas),
                    "under_replicated": p.under_replicated,
                    "offline": p.offline,
                }
                for p in self.partitions
            ],
            "under_replicated_count": len(self.under_replicated),
            "offline_count": len(self.offline),
            "coordinators": {
                kind: {str(partition): broker for partition, broker in sorted(led.items())}
                for kind, led in sorted(self.coordinators().items())
            },
        }


@dataclass(frozen=True, slots=True)
class RawPartition:
    """One partition of the Metadata answer, as sent."""

    topic: str
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline_replicas: tuple[int, ...]


def summarize(
    cluster_id: str | None,
    controller_id: int,
    brokers: Iterable[BrokerInfo],
    partitions: Iterable[RawPartition],
    answered_by: str = "",
) -> ClusterStatus:
    """Classify every partition (offline / under-replicated, see the module docstring)."""
    live = sorted(brokers, key=lambda b: b.broker_id)
    live_ids = {b.broker_id for b in live}
    out = []
    for raw in sorted(partitions, key=lambda p: (p.topic, p.partition)):
        offline = raw.leader == NO_LEADER or raw.leader not in live_ids
        out.append(
            PartitionStatus(
                raw.topic,
                raw.partition,
                raw.leader,
                raw.leader_epoch,
                raw.replicas,
                raw.isr,
                raw.offline_replicas,
                offline=offline,
                under_replicated=not offline and len(raw.isr) < len(raw.replicas),
            )
        )
    return ClusterStatus(cluster_id, controller_id, tuple(live), tuple(out), answered_by)


def read_status(
    bootstrap: str,
    topics: Sequence[str] | None = None,
    *,
    timeout_s: float = 10.0,
    config: Mapping[str, Any] | None = None,
) -> ClusterStatus:
    """One Metadata request (every topic, internal ones included, or ``topics``) to the first
    reachable bootstrap server. Raises WireError (one line) on failure or a topic error."""
    with WireClient.connect(bootstrap, timeout=timeout_s, config=config) as client:
        version = client.version_for(ApiKey.METADATA, METADATA_MAX_VERSION)
        module: Any = client.module(ApiKey.METADATA, version)
        wanted = None if topics is None else tuple(build(module.MetadataRequestTopic, name=t) for t in topics)
        response = client.call(ApiKey.METADATA, version, topics=wanted, allow_auto_topic_creation=False)
        answered_by = client.address
    return _from_response(response, answered_by)


def _from_response(response: Any, answered_by: str) -> ClusterStatus:
    brokers = [BrokerInfo(int(b.node_id), str(b.host), int(b.port)) for b in response.brokers]
    raw: list[RawPartition] = []
    for topic in response.topics:
        if int(topic.error_code) != 0:
            raise WireError(f"topic {topic.name}: {error_name(topic.error_code)}")
        for p in topic.partitions:
            raw.append(
                RawPartition(
                    str(topic.name),
                    int(p.partition_index),
                    int(p.leader_id),
                    int(p.leader_epoch),
                    tuple(int(r) for r in p.replica_nodes),
                    tuple(int(r) for r in p.isr_nodes),
                    tuple(int(r) for r in p.offline_replicas),
                )
            )
    cluster_id = getattr(response, "cluster_id", None)
    return summarize(
        str(cluster_id) if cluster_id is not None else None,
        int(response.controller_id),
        brokers,
        raw,
        answered_by,
    )


# ---------------------------------------------------------------------- rendering
def render(status: ClusterStatus, *, problems_only: bool = False, color: bool = False) -> str:
    """The text report: brokers, controller, a partition table (problems highlighted), counts,
    coordinators."""

    def mark(text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if color else text

    lines = [f"cluster id: {status.cluster_id or '-'}  (metadata from {status.answered_by})"]
    controller = status.controller_id
    lines.append(f"controller: {controller if controller >= 0 else mark('none', '1;31')}")
    lines.append(f"brokers: {len(status.brokers)} alive")
    for b in status.brokers:
        role = "  (controller)" if b.broker_id == controller else ""
        lines.append(f"  {b.broker_id:>4}  {b.endpoint}{role}")
    for missing in status.missing_brokers:
        lines.append(f"  {missing:>4}  {mark('NOT ALIVE', '1;31')} (named as a replica)")
    rows = [p for p in status.partitions if not problems_only or p.offline or p.under_replicated]
    header = ("TOPIC", "PARTITION", "LEADER", "EPOCH", "REPLICAS", "ISR", "STATUS")
    table = [header] + [
        (
            p.topic,
            str(p.partition),
            str(p.leader) if p.leader != NO_LEADER else "none",
            str(p.leader_epoch),
            _ids(p.replicas),
            _ids(p.isr),
            _state(p),
        )
        for p in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines.append("")
    for row in table:
        text = "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        if row[-1].startswith("OFFLINE"):
            text = mark(text, "1;31")
        elif row[-1].startswith("UNDER-REPLICATED"):
            text = mark(text, "33")
        lines.append(text)
    lines.append("")
    lines.append(
        f"partitions: {len(status.partitions)}, under-replicated: {len(status.under_replicated)}, "
        f"offline: {len(status.offline)}"
    )
    for kind, led in sorted(status.coordinators().items()):
        by_broker: dict[int, list[int]] = {}
        for partition, broker in sorted(led.items()):
            by_broker.setdefault(broker, []).append(partition)
        parts = [
            f"broker {b}: {_ranges(ps)}" if b != NO_LEADER else mark(f"NONE (offline): {_ranges(ps)}", "1;31")
            for b, ps in sorted(by_broker.items())
        ]
        lines.append(f"{kind} coordinators ({_topic_of(kind)} partitions): {'; '.join(parts)}")
    return "\n".join(lines)


def _topic_of(kind: str) -> str:
    return next(t for t, k in COORDINATOR_TOPICS.items() if k == kind)


def _state(p: PartitionStatus) -> str:
    if p.offline:
        return "OFFLINE"
    if p.under_replicated:
        missing = [r for r in p.replicas if r not in p.isr]
        return f"UNDER-REPLICATED (out of ISR: {_ids(tuple(missing))})"
    return "ok"


def _ids(ids: Sequence[int]) -> str:
    return ",".join(str(i) for i in ids) or "-"


def _ranges(partitions: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> ``0-2,5``."""
    out: list[str] = []
    start = prev = None
    for p in sorted(partitions):
        if prev is not None and p == prev + 1:
            prev = p
            continue
        if start is not None:
            out.append(f"{start}-{prev}" if start != prev else str(start))
        start = prev = p
    if start is not None:
        out.append(f"{start}-{prev}" if start != prev else str(start))
    return ",".join(out)


def coordinator_of(status: ClusterStatus, kind: str, key: str) -> tuple[int, int] | None:
    """-> (partition, coordinator broker or -1) of a group id / transactional id, from the
    internal topic's partition count (as FindCoordinator maps it), or None if the topic does not
    exist yet."""
    led: Mapping[int, int] = status.coordinators().get(kind, {})
    if not led:
        return None
    count = len(led)
    partition = offsets_partition_for(key, count) if kind == "group" else partition_for(key, count)
    return partition, led.get(partition, NO_LEADER)
