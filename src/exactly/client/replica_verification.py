"""Read every replica of every partition over the wire and compare them
(``exactly cluster verify-replicas``; the comparison is ``exactly.replication.verification``).

How a replica that is not the leader is read: like Kafka's ReplicaVerificationTool, with Fetch
``replica_id = -2`` (Kafka's "debug consumer"). A broker serves that id from any replica it hosts,
leader or follower, up to *that replica's* high watermark, and does not treat it as a follower
(no ISR or high-watermark bookkeeping). A consumer's id -1 is served by the leader only, and a
broker id (>= 0) would make the leader count the tool as a follower.

Steps: Metadata (v9 at most) from the bootstrap servers gives the brokers and every partition's
replicas and leader; one connection per broker then fetches each hosted replica from offset 0 to
the high watermark its first answer reported (later batches are left out: the range is what that
replica had committed when the read began). The leader's log is the reference.

Limits: logs are read from offset 0, so a replica whose log start moved (retention, DeleteRecords)
is reported unreachable with OFFSET_OUT_OF_RANGE; internal topics are skipped unless named (in
this cluster they are local to each broker, not replicated).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i8, i32, i64

from exactly.client.wire import ApiKey, WireClient, WireError, error_name
from exactly.protocol.apis import build
from exactly.records.batch import iter_batches
from exactly.replication.verification import PartitionVerdict, ReplicaBatch, ReplicaLog, compare_replicas
from exactly.types import TopicPartition

__all__ = ["DEBUG_REPLICA_ID", "PartitionReplicas", "cluster_partitions", "read_replica", "verify_replicas"]

DEBUG_REPLICA_ID = -2  # Kafka's FetchRequest.DEBUGGING_CONSUMER_ID
FETCH_VERSION = 11
METADATA_MAX_VERSION = 9
PARTITION_MAX_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class PartitionReplicas:
    tp: TopicPartition
    leader: int
    replicas: tuple[int, ...]


def cluster_partitions(
    client: WireClient, topics: Sequence[str] | None = None
) -> tuple[dict[int, str], list[PartitionReplicas]]:
    """-> (broker id -> ``host:port``, every partition of ``topics``, or of every non-internal topic)."""
    version = client.version_for(ApiKey.METADATA, METADATA_MAX_VERSION)
    module: Any = client.module(ApiKey.METADATA, version)
    wanted = (
        None
        if topics is None
        else tuple(build(module.MetadataRequestTopic, name=TopicName(t)) for t in topics)
    )
    response = client.call(ApiKey.METADATA, version, topics=wanted, allow_auto_topic_creation=False)
    brokers = {int(b.node_id): f"{b.host}:{int(b.port)}" for b in response.brokers}
    partitions: list[PartitionReplicas] = []
    for topic in response.topics:
        if int(topic.error_code) != 0:
            raise WireError(f"topic {topic.name}: {error_name(topic.error_code)}")
        if topics is None and topic.is_internal:
            continue
        for p in topic.partitions:
            partitions.append(
                PartitionReplicas(
                    TopicPartition(str(topic.name), int(p.partition_index)),
                    int(p.leader_id),
                    tuple(int(r) for r in p.replica_nodes),
                )
            )
    partitions.sort(key=lambda p: (p.tp.topic, p.tp.partition))
    return brokers, partitions


def read_replica(client: WireClient, tp: TopicPartition, broker_id: int) -> ReplicaLog:
    """Every batch of the replica at ``client``'s broker, from offset 0 to its high watermark."""
    batches: list[ReplicaBatch] = []
    position = 0
    high_watermark: int | None = None
    log_start = 0
    while high_watermark is None or position < high_watermark:
        part = _fetch(client, tp, position)
        code = int(part.error_code)
        if code != 0:
            raise WireError(f"replica {broker_id} of {tp.topic}-{tp.partition}: {error_name(code)}")
        if high_watermark is None:
            high_watermark = int(part.high_watermark)
            log_start = max(int(part.log_start_offset), 0)
        data = bytes(part.records or b"")
        progressed = False
        for header in iter_batches(data):
            last = header.base_offset + header.last_offset_delta
            if last < position:
                continue
            batches.append(
                ReplicaBatch(header.base_offset, last, data[header.position : header.position + header.size])
            )
            position = last + 1
            progressed = True
        if not progressed:
            break  # nothing more below the high watermark (or a batch larger than the fetch limit)
    return ReplicaLog(broker_id, high_watermark or 0, tuple(batches), log_start)


def _fetch(client: WireClient, tp: TopicPartition, offset: int) -> Any:
    module: Any = client.module(ApiKey.FETCH, FETCH_VERSION)
    partition = build(
        module.FetchPartition,
        partition=i32(tp.partition),
        current_leader_epoch=i32(-1),
        fetch_offset=i64(offset),
        log_start_offset=i64(-1),
        partition_max_bytes=i32(PARTITION_MAX_BYTES),
    )
    response = client.call(
        ApiKey.FETCH,
        FETCH_VERSION,
        replica_id=BrokerId(DEBUG_REPLICA_ID),
        max_wait=datetime.timedelta(0),
        min_bytes=i32(0),
        max_bytes=i32(PARTITION_MAX_BYTES),
        isolation_level=i8(0),
        session_id=i32(0),
        session_epoch=i32(-1),
        topics=(build(module.FetchTopic, topic=TopicName(tp.topic), partitions=(partition,)),),
        forgotten_topics_data=(),
        rack_id="",
    )
    if int(response.error_code) != 0:
        raise WireError(f"Fetch: {error_name(response.error_code)}")
    (topic,) = response.responses
    (part,) = topic.partitions
    return part


def verify_replicas(
    bootstrap: str,
    topics: Sequence[str] | None = None,
    *,
    timeout_s: float = 10.0,
    config: Mapping[str, Any] | None = None,
) -> list[PartitionVerdict]:
    """One verdict per partition of ``topics`` (default: every non-internal topic)."""
    with WireClient.connect(bootstrap, timeout=timeout_s, config=config) as client:
        brokers, partitions = cluster_partitions(client, topics)
    logs: dict[TopicPartition, list[ReplicaLog]] = {p.tp: [] for p in partitions}
    unreachable: dict[TopicPartition, list[str]] = {p.tp: [] for p in partitions}
    for broker_id in sorted({r for p in partitions for r in p.replicas}):
        hosted = [p for p in partitions if broker_id in p.replicas]
        address = brokers.get(broker_id)
        if address is None:
            for p in hosted:
                unreachable[p.tp].append(f"replica {broker_id}: broker not alive")
            continue
        try:
            client = WireClient.connect(address, timeout=timeout_s, config=config)
        except WireError as exc:
            for p in hosted:
                unreachable[p.tp].append(f"replica {broker_id}: {exc}")
            continue
        with client:
            for p in hosted:
                try:
                    logs[p.tp].append(read_replica(client, p.tp, broker_id))
                except WireError as exc:
                    unreachable[p.tp].append(str(exc))
    return [compare_replicas(p.tp, logs[p.tp], p.leader, unreachable[p.tp]) for p in partitions]


def describe(verdicts: Iterable[PartitionVerdict]) -> str:
    return "\n".join(v.describe() for v in verdicts)
