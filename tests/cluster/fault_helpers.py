"""Helpers of the cluster fault tests (``test_cluster_faults``): the authoritative partition
state from ZooKeeper, a continuous idempotent producer (Kafka's VerifiableProducer), reading every
partition back, and the SIGSTOP tools that freeze a broker at an observable moment (Linux /proc
socket queues, not guessed times)."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as KafkaPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kazoo.exceptions import KazooException
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i32, i64

from exactly.cluster.zk import ClusterZk
from exactly.protocol.apis import ApiKey, build, schema
from exactly.records.batch import iter_batches
from exactly.records.builder import decode_batch
from exactly.types import TopicPartition
from tests.cluster.helpers import bootstrap, by_id, wait_for, watermarks
from tests.support.broker import Broker
from tests.support.wire import WireClient, partition_response, produce_request, simple_batch

TOPIC = "faults"


def create_topic(brokers: list[Broker], zk: ClusterZk, partitions: int = 1, min_isr: int = 2) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap(brokers)})
    wait_for(lambda: len(admin.list_topics(timeout=5).brokers) == len(brokers), what="every broker")
    topic = NewTopic(
        TOPIC, num_partitions=partitions, replication_factor=3, config={"min.insync.replicas": str(min_isr)}
    )
    admin.create_topics([topic])[TOPIC].result(timeout=30)
    wait_for(lambda: isr_full(zk), what="leaders and full ISRs")


@dataclass(frozen=True)
class PartitionState:
    leader: int
    isr: tuple[int, ...]


def partition_states(zk: ClusterZk) -> dict[int, PartitionState]:
    """Every partition's leader and ISR as ZooKeeper holds them: the authority (a broker just
    resumed from SIGSTOP answers Metadata from its stale cache until its watches catch up)."""
    states: dict[int, PartitionState] = {}
    try:
        assignment = zk.topic_assignment(TOPIC)
        for p in sorted(assignment.partitions if assignment is not None else ()):
            observed = zk.partition_state(TopicPartition(TOPIC, p))
            if observed is not None:
                state = observed.state.leader_and_isr
                states[p] = PartitionState(state.leader, tuple(sorted(state.isr)))
    except KazooException:
        return {}  # our own session moving (the ZooKeeper pause test): ask again
    return states


def isr_full(zk: ClusterZk) -> bool:
    states = partition_states(zk)
    return bool(states) and all(s.isr == (0, 1, 2) and s.leader >= 0 for s in states.values())


def new_leader_elected(zk: ClusterZk, old: int, partition: int = 0) -> bool:
    state = partition_states(zk).get(partition)
    return state is not None and state.leader not in (old, -1)


def wait_deregistered(zk: ClusterZk, broker_id: int) -> None:
    """Kafka's hard bounce waits for the dead broker's registration to go (its session expired)."""
    wait_for(lambda: broker_id not in live_brokers(zk), timeout=30, what=f"broker {broker_id} to deregister")


def live_brokers(zk: ClusterZk) -> set[int]:
    try:
        return set(zk.live_brokers())
    except KazooException:
        return {0, 1, 2}  # unknown while our own session moves: assume nothing changed


def read_partitions(brokers: list[Broker], partitions: int) -> dict[int, list[int]]:
    """Every record of every partition up to its high watermark (read_uncommitted), as ints."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap(brokers), "group.id": "unused", "enable.auto.commit": False}
    )
    try:
        # the preferred-leader election after a bounce may move a leader under this very request
        ends = {p: watermarks(consumer, TOPIC, p)[1] for p in range(partitions)}
        consumer.assign([KafkaPartition(TOPIC, p, 0) for p in range(partitions) if ends[p] > 0])
        seen: dict[int, list[int]] = {p: [] for p in range(partitions)}
        positions = {p: 0 for p in range(partitions)}
        while any(positions[p] < ends[p] for p in range(partitions)):
            msg = consumer.poll(15)
            assert msg is not None, f"read stalled at {positions} of {ends}"
            assert msg.error() is None, msg.error()
            seen[msg.partition()].append(int(msg.value()))
            positions[msg.partition()] = msg.offset() + 1
        return seen
    finally:
        consumer.close()


def _debug_config() -> dict[str, Any]:
    """librdkafka's own log (``debug=eos,msg,protocol``, or ``EXACTLY_TEST_RDKAFKA_DEBUG``'s
    contexts) into the file named by ``EXACTLY_TEST_RDKAFKA_LOG``, to keep the producer's side of
    a failure (ids, epochs, sequences, epoch bumps, retries); nothing when unset."""
    path = os.environ.get("EXACTLY_TEST_RDKAFKA_LOG")
    if not path:
        return {}
    logger = logging.getLogger(f"rdkafka-{path}")
    if not logger.handlers:
        handler = logging.FileHandler(path)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
    return {"debug": os.environ.get("EXACTLY_TEST_RDKAFKA_DEBUG", "eos,msg,protocol"), "logger": logger}


@dataclass
class ContinuousProducer:
    """An idempotent acks=all producer writing ``i`` to partition ``i % partitions`` until stopped
    (Kafka's VerifiableProducer in ReplicationTest); ``acked`` per partition in ack order."""

    brokers: list[Broker]
    partitions: int
    # librdkafka's wait for an answer; a frozen broker's in-flight requests block their partition
    # (idempotence keeps them ordered) until it passes
    request_timeout_ms: int = 30_000
    acked: dict[int, list[int]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> ContinuousProducer:
        self.acked = {p: [] for p in range(self.partitions)}
        self._thread = threading.Thread(target=self._run, name="continuous-producer", daemon=True)
        self._thread.start()
        return self

    def count(self, partition: int | None = None) -> int:
        with self._lock:
            if partition is not None:
                return len(self.acked[partition])
            return sum(len(v) for v in self.acked.values())

    def _on_delivery(self, err: KafkaError | None, msg: object) -> None:
        with self._lock:
            if err is not None:
                self.errors.append(str(err))
            else:
                self.acked[msg.partition()].append(int(msg.value()))  # type: ignore[attr-defined]

    def _run(self) -> None:
        producer = Producer(
            {
                "bootstrap.servers": bootstrap(self.brokers),
                "enable.idempotence": True,
                "acks": "all",
                "max.in.flight.requests.per.connection": 5,
                "message.timeout.ms": 120_000,
                "linger.ms": 5,
                "request.timeout.ms": self.request_timeout_ms,
                "socket.timeout.ms": max(self.request_timeout_ms, 10_000),
                **_debug_config(),
            }
        )
        i = 0
        while not self._stop.is_set():
            if len(producer) < 200:
                producer.produce(
                    TOPIC, value=str(i).encode(), partition=i % self.partitions, on_delivery=self._on_delivery
                )
                i += 1
            producer.poll(0.005)
        remaining = producer.flush(120)
        if remaining:
            self.errors.append(f"{remaining} records never delivered")

    def stop(self) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(150)
        assert not self._thread.is_alive(), "the producer did not finish"


def produce_acked(brokers: list[Broker], values: range) -> list[int]:
    """Produce ``values`` to partition 0 with an idempotent acks=all producer; all must be acked."""
    producer = Producer({"bootstrap.servers": bootstrap(brokers), "enable.idempotence": True, "acks": "all"})
    acked: list[int] = []
    errors: list[str] = []

    def on_delivery(err: KafkaError | None, msg: object) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            acked.append(int(msg.value()))  # type: ignore[attr-defined]

    for i in values:
        producer.produce(TOPIC, value=str(i).encode(), partition=0, on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert errors == []
    return acked


def fail_over(brokers: list[Broker], zk: ClusterZk, partition: int = 0) -> Broker:
    """SIGKILL the partition's leader and wait for its registration to go and a new leader; -> it."""
    leader = partition_states(zk)[partition].leader
    victim = by_id(brokers, leader)
    victim.kill()
    wait_deregistered(zk, leader)
    wait_for(lambda: new_leader_elected(zk, leader, partition), timeout=30, what="a new leader")
    return victim


def fetch_response_waiting(follower: Broker, leader: Broker) -> bool:
    """Whether ``follower``'s connection to ``leader`` holds unread bytes (Linux /proc).

    With the follower SIGSTOPped, that means the leader has answered its last fetch and, the
    follower being unable to send another, holds no parked fetch of it: a record appended at the
    leader now cannot travel to this follower's socket. The follower's fetcher is its only
    connection to the leader that carries traffic."""
    assert follower.pid is not None and leader.port is not None
    inodes: set[str] = set()
    fd_dir = Path(f"/proc/{follower.pid}/fd")
    for fd in fd_dir.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            rx_queue = int(fields[4].split(":")[1], 16)
            if remote_port == leader.port and fields[9] in inodes and rx_queue > 0:
                return True
    return False


def freeze_without_parked_fetch(follower: Broker, leader: Broker) -> None:
    """SIGSTOP ``follower`` at a moment where it has no fetch parked at ``leader``. If it was
    stopped between reading an answer and sending its next fetch (no answer will come), let it
    run again and retry."""
    assert follower.pid is not None
    for _ in range(20):
        os.kill(follower.pid, signal.SIGSTOP)
        try:
            wait_for(
                lambda: fetch_response_waiting(follower, leader),
                timeout=1.5,
                what="the parked fetch's answer",
            )
            return
        except AssertionError:
            os.kill(follower.pid, signal.SIGCONT)
    raise AssertionError(f"{follower.name} could not be frozen without a fetch parked at {leader.name}")


def leader_alone_writes_then_dies(
    victim: Broker, followers: list[Broker], topic: str, values: list[bytes]
) -> None:
    """``values`` reach partition 0's leader ``victim`` alone (acks=1), then it is killed -9: the
    records exist nowhere else (KIP-101's unreplicated tail). The followers are frozen without a fetch
    parked at the leader while it writes (a parked fetch would carry the records to them), and run
    again once it died."""
    frozen: list[Broker] = []
    try:
        for follower in followers:
            freeze_without_parked_fetch(follower, victim)
            frozen.append(follower)
        with WireClient(victim.bootstrap) as wire:
            response = wire.send(produce_request(topic, 0, simple_batch(values), acks=1))
            assert int(partition_response(response).error_code) == 0
        victim.kill()
    finally:
        for follower in frozen:
            assert follower.pid is not None
            os.kill(follower.pid, signal.SIGCONT)


def await_new_leader(survivors: list[Broker], topic: str, old: int) -> None:
    """Wait until the survivors' metadata names a leader of ``topic``'s partition 0 other than ``old``."""
    admin = AdminClient({"bootstrap.servers": bootstrap(survivors)})
    wait_for(
        lambda: admin.list_topics(topic, timeout=5).topics[topic].partitions[0].leader not in (old, -1),
        timeout=30,
        what="a new leader",
    )


def request_queued(broker: Broker, wire: WireClient) -> bool:
    """Whether the bytes ``wire`` sent wait unread at ``broker`` (it is stopped: the kernel took
    the connection and the request for it)."""
    client_port = wire.sock.getsockname()[1]
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if (
                local_port == broker.port
                and remote_port == client_port
                and int(fields[4].split(":")[1], 16) > 0
            ):
                return True
    return False


def latest_offset(broker: Broker, version: int) -> tuple[int, int]:
    """A consumer's ListOffsets(latest) for partition 0 at ``broker`` -> (error code, offset)."""
    with WireClient(broker.bootstrap) as wire:
        module: Any = schema(ApiKey.LIST_OFFSETS, version).request_module
        partition = build(module.ListOffsetsPartition, partition_index=i32(0), timestamp=i64(-1))
        request = build(
            module.ListOffsetsRequest,
            replica_id=BrokerId(-1),
            topics=(build(module.ListOffsetsTopic, name=TopicName(TOPIC), partitions=(partition,)),),
        )
        (t,) = wire.send(request).topics
    (p,) = t.partitions
    return int(p.error_code), int(p.offset)


def segment_size(broker: Broker) -> int:
    return sum(p.stat().st_size for p in broker.partition_dir(TOPIC, 0).glob("*.log"))


def duplicate_report(data_dirs: list[Path], topic: str, partition: int) -> str:
    """Every value stored more than once in ``topic-partition``, read from each replica's segment
    files on disk (after the brokers stopped): for each copy, the batch's offsets, producer id,
    epoch, base sequence and the leader epoch that appended it. What a duplicate's failure
    message needs to say where the second copy came from."""
    lines: list[str] = []
    for data_dir in data_dirs:
        copies: dict[bytes | None, list[str]] = {}
        for segment in sorted((data_dir / f"{topic}-{partition}").glob("*.log")):
            buf = segment.read_bytes()
            for header in iter_batches(buf):
                _, records = decode_batch(buf, header.position)
                where = (
                    f"offsets {header.base_offset}-{header.base_offset + header.last_offset_delta}"
                    f" pid {header.producer_id} epoch {header.producer_epoch}"
                    f" seq {header.base_sequence} leader_epoch {header.partition_leader_epoch}"
                )
                for record in records:
                    copies.setdefault(record.value, []).append(f"@{record.offset} in {where}")
        for value, where_all in copies.items():
            if len(where_all) > 1:
                lines.append(f"{data_dir.name} {topic}-{partition} value {value!r}: " + "; ".join(where_all))
    return "\n".join(lines) or f"no value stored twice in {topic}-{partition} on disk"


def describe_difference(read: list[int], acked: list[int]) -> str:
    """What a read of a partition has that its acknowledgements do not (and the reverse)."""
    counts = Counter(read)
    twice = sorted(v for v, n in counts.items() if n > 1)
    missing = sorted(set(acked) - set(counts))
    extra = sorted(set(counts) - set(acked))
    return f"read twice {twice[:20]}, acked but not read {missing[:20]}, read but not acked {extra[:20]}"


def epoch_bump_duplicates(data_dir: Path, topic: str, partition: int) -> tuple[set[bytes | None], list[str]]:
    """The values stored twice in the shape librdkafka's KIP-360 epoch bump produces (the same
    producer id, the second copy under a higher producer epoch), and a description of every
    other duplicate (which no client behaviour explains: a dedup hole). Read from one replica's
    segment files, brokers stopped.

    Why the bump shape exists (bench/results/dupbounce-s18.md): after a failover to a leader whose
    ISR is below min.insync.replicas, the retry of a batch that leader already holds is refused
    with NOT_ENOUGH_REPLICAS before the dedup check (Kafka's order), librdkafka files it as "not
    persisted", and when the ISR grows before its next pipelined request, that one gets
    OUT_OF_ORDER_SEQUENCE, on which librdkafka bumps the epoch and re-sends every unacknowledged
    record, the durable one included, renumbered from 0."""
    copies: dict[bytes | None, list[tuple[int, int, int]]] = {}  # value -> (offset, pid, epoch)
    for segment in sorted((data_dir / f"{topic}-{partition}").glob("*.log")):
        buf = segment.read_bytes()
        for header in iter_batches(buf):
            _, records = decode_batch(buf, header.position)
            for record in records:
                copies.setdefault(record.value, []).append(
                    (record.offset, header.producer_id, header.producer_epoch)
                )
    bumped: set[bytes | None] = set()
    other: list[str] = []
    for value, where in copies.items():
        if len(where) == 1:
            continue
        (_, pid1, epoch1), *rest = sorted(where)
        if len(rest) == 1 and rest[0][1] == pid1 and rest[0][2] > epoch1:
            bumped.add(value)
        else:
            other.append(f"{value!r}: {where}")
    return bumped, other


def without_second_copies(read: list[int], values: set[bytes | None]) -> list[int]:
    """``read`` with the second occurrence of each of ``values`` (as stored bytes) removed."""
    wanted = {int(v) for v in values if v is not None}
    seen: set[int] = set()
    out: list[int] = []
    for v in read:
        if v in wanted and v in seen:
            continue
        seen.add(v)
        out.append(v)
    return out
