"""Workloads of the replicated cluster (issue #9): throughput and CPU of RF 3 vs RF 1, produce-to-ack
latency at 1,000 msg/s, and failover time after kill -9 / SIGTERM of a partition leader.

Every workload starts its own ZooKeeper + 3 brokers (bench/benchlib/cluster.py) in ``setup`` and stops
them in ``teardown`` (``own_broker``), so the shared single broker of run.py is not running meanwhile.

What "RF 1" means here: a replication-factor-1 topic **on the same 3-broker cluster** (same processes,
same ZooKeeper session, same code path through the replica manager; only the replication differs), and,
as a second reference in the throughput pairs, the **single broker** (no ``zookeeper.connect``: the
embedded default), started beside the cluster for the whole workload.  Topics are placed by an explicit
replica assignment so broker 0 leads every measured partition (RF 3: ``[0, 1, 2]``, RF 1: ``[0]``):
the leader's work is on one known process, the followers' on the two others.
"""

from __future__ import annotations

import datetime
import itertools
import json
import signal
import struct
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from confluent_kafka import OFFSET_BEGINNING, Producer, TopicPartition
from confluent_kafka.admin import NewTopic
from kazoo.client import KazooClient
from kio.schema.types import TopicName
from kio.static.primitive import Records, i16, i32

from benchlib import batch_producer, brokers, drivers, kafka
from benchlib.brokers import BrokerProcess
from benchlib.cluster import DEFAULT_SESSION_TIMEOUT_MS, Cluster
from benchlib.workloads import (
    GB,
    Context,
    Meter,
    Target,
    Workload,
    _prefixed,
    fixed_rate_latency,
    register,
    throughput_sample,
)
from exactly.client.wire import WireClient, WireError
from exactly.records.builder import Record, build_batch

MIN_ISR = "2"
RF3_CONFIG = {"min.insync.replicas": MIN_ISR}
LEADER = 0  # broker id that leads every measured partition (explicit assignment)


def _place(cluster: Cluster, prefix: str, rf: int, partitions: int = 1, leader: int = LEADER) -> str:
    """A fresh topic whose partitions are led by broker ``leader`` (RF 3: the other two follow)."""
    topic = f"{prefix}-rf{rf}-{uuid.uuid4().hex[:6]}"
    others = [b for b in range(cluster.count) if b != leader]
    assignment = [[leader, *others][:rf] for _ in range(partitions)]
    a = cluster.admin()  # kept alive until the future resolves (a collected handle fails it)
    futs = a.create_topics(
        [
            NewTopic(
                topic,
                num_partitions=partitions,
                replica_assignment=assignment,
                config=RF3_CONFIG if rf > 1 else {},
            )
        ],
        operation_timeout=60,
        request_timeout=60,
    )
    futs[topic].result(timeout=60)
    cluster.wait_full_isr(topic, partitions, rf)
    return topic


def _leader_process(cluster: Cluster, broker_id: int = LEADER) -> BrokerProcess:
    """Broker ``broker_id`` (default: the leader) as a ``BrokerProcess`` (for --profile and RSS)."""
    b = cluster.brokers[broker_id]
    assert b.process is not None
    return BrokerProcess(
        "exactly", b.process, b.bootstrap, b.log_path, b.started_at, b.listening_s, b.data_dir, {}, b
    )


def _start_cluster(
    ctx: Context,
    tag: str,
    session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS,
    extra: dict[str, str] | None = None,
) -> Cluster:
    overrides = {**(extra or {}), **dict(opt.split("=", 1) for opt in ctx.broker_options)}
    work = ctx.scratch / f"cluster-{tag}-{uuid.uuid4().hex[:6]}"
    cluster = Cluster(work, 3, session_timeout_ms, overrides)
    cluster.start()
    print(
        f"-- cluster up at {cluster.bootstrap} (ZooKeeper {cluster.zk_connect}, session timeout "
        f"{session_timeout_ms} ms, ready in {cluster.ready_s:.1f} s)",
        flush=True,
    )
    return cluster


def read_back(bootstrap: str, topic: str, expected: int, timeout: float = 120.0) -> tuple[int, int, int]:
    """Partition 0 from the start: (probe records, producer records stored more than once, records read).
    Producer records are told apart by their first 8 bytes (the produce() timestamp, unique per record)."""
    c = kafka.consumer(bootstrap)
    seen: set[bytes] = set()
    probes = duplicates = read = 0
    try:
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + timeout
        while read < expected and time.monotonic() < deadline:
            for m in c.consume(1000, 1.0):
                if m.error() is not None:
                    continue
                read += 1
                value = m.value()
                if value == PROBE_VALUE:
                    probes += 1
                    continue
                key = value[:8]
                if key in seen:
                    duplicates += 1
                seen.add(key)
    finally:
        c.close()
    return probes, duplicates, read


PROBE_VALUE = b"probe"


class WireProbe:
    """Connections to the surviving brokers for one-record acks=all Produce requests (v8, no producer
    id) to partition 0 of ``topic``.  ``appended``: records acknowledged; ``uncertain``: requests whose
    answer left open whether the record was appended (a timeout), for the log-count check."""

    def __init__(self, survivors: list[Any], topic: str) -> None:
        self.topic = topic
        self.clients = [
            WireClient.connect(b.bootstrap, timeout=10, client_id="bench-probe") for b in survivors
        ]
        self.appended = 0
        self.uncertain = 0
        self.batch = build_batch(
            [Record(value=PROBE_VALUE, key=None)], base_timestamp=int(time.time() * 1000)
        )

    def attempt(self) -> bool:
        for client in self.clients:
            mod: Any = client.module(PRODUCE_API_KEY, PRODUCE_VERSION)
            request = mod.ProduceRequest(
                transactional_id=None,
                acks=i16(-1),
                timeout=datetime.timedelta(milliseconds=2_000),
                topic_data=(
                    mod.TopicProduceData(
                        name=TopicName(self.topic),
                        partition_data=(mod.PartitionProduceData(index=i32(0), records=Records(self.batch)),),
                    ),
                ),
            )
            try:
                response = client.send(request)
            except WireError:
                self.uncertain += 1
                continue
            code = int(response.responses[0].partition_responses[0].error_code)
            if code == 0:
                self.appended += 1
                return True
            if code in UNCERTAIN_PRODUCE_ERRORS:
                self.uncertain += 1
        return False

    def close(self) -> None:
        for client in self.clients:
            client.close()


PRODUCE_API_KEY = 0
PRODUCE_VERSION = 8
# REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS_AFTER_APPEND: appended, not (yet) acknowledged
UNCERTAIN_PRODUCE_ERRORS = frozenset({7, 20})


# --------------------------------------------------------------------------------------- throughput


class ClusterProduce(Workload):
    """RF 3 (acks=all, min.insync.replicas=2) vs RF 1 on the same cluster vs the single broker, back to
    back in every repetition (order rotating), confluent-kafka produce loop as ``produce-confluent-p*``
    (1 KB, idempotent, acks=all, linger.ms=10, 1 MB batches), ``ctx.records`` records, fresh topic each.
    Cluster CPU = sum over the three broker processes; ZooKeeper's CPU separately; the leader's share
    (broker 0) too.  ratio = RF 3 MB/s / RF 1 (cluster) MB/s per repetition."""

    kind = "cluster-pair"
    peer_ok = False
    own_broker = True
    partitions: ClassVar[int] = 1
    variants: ClassVar[tuple[str, ...]] = ("rf3", "rf1", "single")
    targets = (
        Target("ratio", ">=", 0.5, "RF 3 / RF 1 MB/s", "#9"),
        Target("rf3_broker_cpu_s_per_gb", "<=", 3.0, "cluster broker CPU-s/GB (RF 3)", "#9"),
    )

    def setup(self, ctx: Context, broker: BrokerProcess | None) -> dict[str, Any]:
        cluster = _start_cluster(ctx, "produce")
        single = None
        try:
            if "single" in self.variants:
                single = brokers.start_exactly(
                    ctx.scratch / f"single-{uuid.uuid4().hex[:6]}", ctx.broker_options
                )
        except BaseException:
            cluster.stop()
            raise
        return {"cluster": cluster, "single": single, "warmup": {}}

    def measured_broker(self, broker: BrokerProcess | None, state: Any) -> BrokerProcess | None:
        return _leader_process(state["cluster"]) if isinstance(state, dict) else broker

    def profiled_brokers(self, broker: BrokerProcess | None, state: Any) -> list[tuple[str, BrokerProcess]]:
        if not isinstance(state, dict):
            return []
        return [
            ("leader", _leader_process(state["cluster"])),
            ("follower", _leader_process(state["cluster"], 1)),
        ]

    def _one(self, ctx: Context, state: dict[str, Any], variant: str, rep: int) -> dict[str, Any]:
        cluster: Cluster = state["cluster"]
        single: BrokerProcess | None = state["single"]
        target: Any = single if variant == "single" else cluster
        wire = variant.endswith("_wire")
        if variant == "single":
            assert single is not None
            topic = f"{self.name}-single-r{rep}-{uuid.uuid4().hex[:6]}"
            kafka.create_topic(single.bootstrap, topic, self.partitions)
        else:
            topic = _place(cluster, self.name, 3 if variant.startswith("rf3") else 1, self.partitions)
        if not wire and variant not in state["warmup"]:
            # the warm-up record goes to an RF 1 topic of the same target (never a measured one)
            state["warmup"][variant] = (
                ctx.warmup_topic(single) if variant == "single" else _place(cluster, "bench-warmup", 1)
            )
        size = len(ctx.pool[0])
        timeout = ctx.timeout_for(ctx.records * size)
        # the wire producer connects, gets its producer id and encodes its batches before the meter
        # starts (librdkafka's connect, metadata and warm-up record are inside it, but take ~ms)
        ready = (
            batch_producer.BatchProducerProcess(
                cluster.brokers[LEADER].bootstrap, topic, ctx.records, timeout
            )
            if wire
            else None
        )
        zk0 = cluster.zk_cpu_seconds()
        per0 = cluster.broker_cpu()
        with Meter(target) as meter:
            if ready is not None:
                run = ready.go()
            else:
                run = drivers.confluent_produce(
                    target.bootstrap,
                    topic,
                    ctx.records,
                    ctx.pool,
                    timeout,
                    warmup_topic=state["warmup"][variant],
                )
        zk_cpu = cluster.zk_cpu_seconds() - zk0
        per1 = cluster.broker_cpu()
        in_log = ctx.count_records(target, topic, self.partitions)
        if in_log != run.records:
            run.errors.append(f"log holds {in_log} records, producer reported {run.records} delivered")
        sample = throughput_sample(run, meter, ctx.records)
        gb = run.bytes / GB if run.bytes else None
        if wire and run.extra.get("first_offset") != 0:
            run.errors.append(f"first batch stored at offset {run.extra.get('first_offset')}, expected 0")
        if variant != "single":
            leader_cpu = per1.get(LEADER, 0.0) - per0.get(LEADER, 0.0)
            sample["leader_cpu_s_per_gb"] = leader_cpu / gb if gb else None
            sample["followers_cpu_s_per_gb"] = (meter.broker_cpu - leader_cpu) / gb if gb else None
            sample["zk_cpu_s"] = zk_cpu
            sample["zk_cpu_s_per_gb"] = zk_cpu / gb if gb else None
        if variant == "single":
            kafka.delete_topic(single.bootstrap, topic)
        else:
            cluster.delete_topic(topic)
        return sample

    def run_once(
        self, ctx: Context, broker: BrokerProcess | None, state: dict[str, Any], rep: int
    ) -> dict[str, Any]:
        parts: dict[str, dict[str, Any]] = {}

        def one(v: str) -> dict[str, Any]:
            parts[v] = self._one(ctx, state, v, rep)
            return parts[v]

        out = run_alternating(list(self.variants), rep, one)
        for key, (a, b) in {
            "ratio": ("rf3", "rf1"),
            "ratio_wire": ("rf3_wire", "rf1_wire"),
            "rf3_wire_vs_rf3": ("rf3_wire", "rf3"),
            "ratio_single": ("rf3", "single"),
            "rf1_vs_single": ("rf1", "single"),
        }.items():
            if a in parts and b in parts and parts[b]["mb_s"]:
                out[key] = parts[a]["mb_s"] / parts[b]["mb_s"]
        return out

    def teardown(self, ctx: Context, broker: BrokerProcess | None, state: dict[str, Any]) -> None:
        if state["single"] is not None:
            state["single"].stop()
        state["cluster"].stop()


def _load1() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def run_alternating(variants: list[str], rep: int, one: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    """One repetition of a side-by-side comparison: every variant run once by ``one``, starting with
    a different one each repetition (so neither always runs on the warmer or the busier box); the
    sample holds each variant's figures under its prefix, ``ok`` only when all ran."""
    n = len(variants)
    order = [variants[(rep + k) % n] for k in range(n)]
    parts = {v: one(v) for v in order}
    errors = [f"{v}: {parts[v]['error']}" for v in order if not parts[v]["ok"]]
    out: dict[str, Any] = {
        "ok": not errors,
        "error": "; ".join(errors)[:1000],
        "order": "/".join(order),
        "load1": _load1(),
    }
    for v in order:
        out.update(_prefixed(v, parts[v]))
    return out


# RF 3 alone (not default): for `--profile`, which records the leader and a follower during one repetition
register(
    type(
        "cluster_produce_rf3_p1",
        (ClusterProduce,),
        {
            "name": "cluster-produce-rf3-p1",
            "title": "3-broker cluster: produce 1 KB, 1 partition, RF 3 acks=all only (for --profile)",
            "variants": ("rf3",),
            "default": False,
            "targets": (),
        },
    )
)
# librdkafka beside the blocking wire producer (benchlib/batch_producer.py --idempotent), RF 3 and RF 1
# each, alternating in every repetition (not default: the librdkafka pair above stays the plain run's)
register(
    type(
        "cluster_produce_clients_p1",
        (ClusterProduce,),
        {
            "name": "cluster-produce-clients-p1",
            "title": "3-broker cluster: produce 1 KB, 1 partition, RF 3 acks=all vs RF 1, confluent-kafka "
            "and the blocking idempotent wire producer side by side",
            "variants": ("rf3", "rf1", "rf3_wire", "rf1_wire"),
            "default": False,
            "targets": (
                Target("ratio", ">=", 0.5, "RF 3 / RF 1 MB/s (confluent-kafka)", "#9"),
                Target("ratio_wire", ">=", 0.5, "RF 3 / RF 1 MB/s (wire producer)", "#9"),
                Target(
                    "rf3_broker_cpu_s_per_gb", "<=", 3.0, "cluster broker CPU-s/GB (RF 3, confluent)", "#9"
                ),
                Target(
                    "rf3_wire_broker_cpu_s_per_gb", "<=", 3.0, "cluster broker CPU-s/GB (RF 3, wire)", "#9"
                ),
            ),
        },
    )
)
for _parts, _default in ((1, True), (3, False)):
    register(
        type(
            f"cluster_produce_p{_parts}",
            (ClusterProduce,),
            {
                "name": f"cluster-produce-p{_parts}",
                "title": f"3-broker cluster: produce 1 KB, {_parts} partition{'s' if _parts > 1 else ''}, "
                "RF 3 acks=all vs RF 1 (same cluster) vs single broker, confluent-kafka",
                "partitions": _parts,
                "default": _default,
            },
        )
    )


# ------------------------------------------------------------------------------------------ latency


@register
class ClusterLatency(Workload):
    """``latency-1k`` on the cluster: 1,000 msg/s, 1 KB, linger.ms=0, acks=all, idempotent, to an RF 3
    topic (min.insync.replicas=2: the ack waits for a follower's fetch) and to an RF 1 topic on the same
    cluster, back to back in each repetition (order alternating)."""

    name = "cluster-latency-1k"
    kind = "cluster-latency"
    title = "3-broker cluster: latency at 1,000 msg/s, 1 KB, acks=all, RF 3 vs RF 1"
    peer_ok = False
    own_broker = True
    targets = (Target("rf3_ack_p99_ms", "<=", 5.0, "ms produce-to-ack p99 (RF 3, acks=all)", "#9"),)

    def setup(self, ctx: Context, broker: BrokerProcess | None) -> dict[str, Any]:
        return {"cluster": _start_cluster(ctx, "latency")}

    def measured_broker(self, broker: BrokerProcess | None, state: Any) -> BrokerProcess | None:
        return _leader_process(state["cluster"]) if isinstance(state, dict) else broker

    def run_once(
        self, ctx: Context, broker: BrokerProcess | None, state: dict[str, Any], rep: int
    ) -> dict[str, Any]:
        cluster: Cluster = state["cluster"]

        def one(v: str) -> dict[str, Any]:
            topic = _place(cluster, self.name, 3 if v == "rf3" else 1)
            part = fixed_rate_latency(ctx, cluster, topic)
            cluster.delete_topic(topic)
            return part

        return run_alternating(["rf1", "rf3"], rep, one)

    def teardown(self, ctx: Context, broker: BrokerProcess | None, state: dict[str, Any]) -> None:
        state["cluster"].stop()


# ----------------------------------------------------------------------------------------- failover


class Failover(Workload):
    """An idempotent producer (acks=all, linger.ms=0, 5 in flight) writes 1 KB records at a steady
    ``rate``/s to an RF 3 partition (min.insync.replicas=2) led by broker L; after 1 s, L gets
    ``signal`` at t0.  Measured from t0:

    - ``failover_s``: the first delivery report of a record *produced after t0* (only a new leader can
      acknowledge it: the old one is gone, or, with a controlled shutdown, has handed leadership over
      before its process ends) -- the time the partition was unavailable to a writer;
    - ``metadata_s``: a surviving broker's Metadata first names the new leader (polled every 10 ms
      from t0): what a client can learn; the rest up to ``failover_s`` is the client finding it and
      the new leader's first acks=all round (its followers re-fetching from it);
    - ``wire_ack_s``: a raw one-record acks=all Produce, sent every 10 ms from t0 to each surviving
      broker over connections opened before t0, first succeeded: when the cluster itself acknowledges
      a write again, without any client's retry or back-off logic;
    - ``gone_s``: L's ``/brokers/ids`` znode disappeared (session expiry after kill -9; a clean SIGTERM
      closes the session at once);  ``elected_s``: the partition's state znode names another leader;
    - ``max_gap_s``: the longest interval without any delivery report from 1 s before t0 to the end
      (for a controlled shutdown that moves leadership first, this is the unavailability);
    - ``exit_s`` (SIGTERM): the process has exited.

    Verified: every record acknowledged, none with an error, and the log holds exactly the records
    produced so far (no loss, no duplicates across the failover).  Afterwards L is restarted and the run
    waits for a full ISR again (``rejoin_s``), so every repetition starts from 3 in-sync replicas; the
    next repetition kills whichever broker leads then (``victim``; ``victim_was_controller`` says whether
    the controller had to move too)."""

    kind = "failover"
    peer_ok = False
    own_broker = True
    session_timeout_ms: ClassVar[int] = DEFAULT_SESSION_TIMEOUT_MS
    sig: ClassVar[int] = signal.SIGKILL
    rate: ClassVar[int] = 500
    producer_conf: ClassVar[dict[str, object]] = {}  # on top of the defaults (see the *-fast-retry variants)

    def setup(self, ctx: Context, broker: BrokerProcess | None) -> dict[str, Any]:
        cluster = _start_cluster(ctx, self.name, self.session_timeout_ms)
        try:
            topic = _place(cluster, self.name, 3)
        except BaseException:
            cluster.stop()
            raise
        return {"cluster": cluster, "topic": topic}

    def run_once(
        self, ctx: Context, broker: BrokerProcess | None, state: dict[str, Any], rep: int
    ) -> dict[str, Any]:
        cluster: Cluster = state["cluster"]
        topic: str = state["topic"]
        leader, _replicas, isr, controller = cluster.partition(topic)
        victim = cluster.brokers[leader]
        marks: dict[str, int] = {}
        acks: list[tuple[int, int]] = []  # (produced ns, acked ns)
        errors: list[str] = []
        now_ns = time.perf_counter_ns

        def on_delivery(err: Any, msg: Any) -> None:
            t = now_ns()
            if err is not None:
                if len(errors) < 20:
                    errors.append(str(err))
                return
            produced = struct.unpack_from(">Q", msg.value())[0]
            acks.append((produced, t))
            t0 = marks.get("t0")
            if t0 is not None and produced > t0 and "first_ack" not in marks:
                marks["first_ack"] = t

        state_path = f"/brokers/topics/{topic}/partitions/0/state"
        zk = KazooClient(hosts=cluster.zk_connect, timeout=10)
        zk.start(15)

        def on_ids(children: list[str]) -> None:
            if "t0" in marks and str(leader) not in children and "gone" not in marks:
                marks["gone"] = now_ns()

        def on_state(data: bytes | None, _stat: Any) -> None:
            if "t0" not in marks or "elected" in marks or not data:
                return
            decoded = json.loads(data)
            new = decoded.get("leader", -1)
            if new not in (leader, -1):
                marks["elected"] = now_ns()
                marks["new_leader"] = new
                marks["isr_at_election"] = len(decoded.get("isr", []))

        survivor = next(b for i, b in enumerate(cluster.brokers) if i != leader and b.running)
        probe_stop = threading.Event()

        wire = WireProbe([b for i, b in enumerate(cluster.brokers) if i != leader and b.running], topic)

        def wire_probe() -> None:
            """A one-record acks=all Produce every 10 ms to each surviving broker until one succeeds:
            the moment the cluster itself accepts and acknowledges a write, with no client retry or
            back-off logic in the way (connections opened before t0)."""
            while not probe_stop.is_set():
                if wire.attempt():
                    marks["wire_ack"] = now_ns()
                    return
                probe_stop.wait(0.01)

        def metadata_probe() -> None:
            """When a surviving broker's Metadata first names a new leader (what a client can learn)."""
            a = kafka.admin(survivor.bootstrap)
            while not probe_stop.is_set():
                try:
                    md = a.list_topics(topic=topic, timeout=1)
                    new = md.topics[topic].partitions[0].leader
                    if new not in (leader, -1):
                        marks["metadata"] = now_ns()
                        break
                except Exception:
                    pass
                probe_stop.wait(0.01)

        probe = threading.Thread(target=metadata_probe, daemon=True)
        wire_thread = threading.Thread(target=wire_probe, daemon=True)
        zk.ChildrenWatch("/brokers/ids", on_ids)
        zk.DataWatch(state_path, on_state)
        p = Producer(
            {
                "bootstrap.servers": cluster.bootstrap,
                **drivers.PRODUCE_CONF,
                "linger.ms": 0,
                "message.timeout.ms": 2 * self.session_timeout_ms + 60_000,
                **kafka.QUIET,
                **self.producer_conf,
            }
        )
        pad = ctx.pool[0][8:]
        produced = 0
        limit_s = self.session_timeout_ms / 1000 + 60
        try:
            p.list_topics(topic, timeout=30)
            p.produce(topic, struct.pack(">Q", now_ns()) + pad, on_delivery=on_delivery)
            if p.flush(30):
                raise RuntimeError("first record not acknowledged")
            produced = 1
            start = time.perf_counter()
            interval = 1.0 / self.rate
            for i in range(10_000_000):
                due = start + i * interval
                for _ in range(100_000):
                    left = due - time.perf_counter()
                    if left <= 0:
                        break
                    p.poll(min(left, 0.001))
                p.produce(topic, struct.pack(">Q", now_ns()) + pad, on_delivery=on_delivery)
                produced += 1
                p.poll(0)
                elapsed = time.perf_counter() - start
                if "t0" not in marks and elapsed >= 1.0:
                    marks["t0"] = now_ns()
                    if self.sig == signal.SIGKILL:
                        victim.kill()
                    else:
                        assert victim.process is not None
                        victim.process.send_signal(self.sig)
                    probe.start()
                    wire_thread.start()
                if "t0" in marks and "exit" not in marks and not victim.running:
                    marks["exit"] = now_ns()
                if "first_ack" in marks and now_ns() - marks["first_ack"] > 300_000_000:
                    break  # 0.3 s of writes on the new leader, then stop
                if elapsed > limit_s:
                    errors.append(
                        f"no record produced after the {signal.Signals(self.sig).name} acked in {limit_s:.0f} s"
                    )
                    break
            left = p.flush(limit_s)
            if left:
                errors.append(f"{left} records not acknowledged")
        finally:
            probe_stop.set()
            for thread in (probe, wire_thread):
                if thread.is_alive():
                    thread.join(10)
            wire.close()
            zk.stop()
            zk.close()
        t0 = marks["t0"]
        # the victim must be gone for the restart (SIGTERM: waits for its exit)
        if victim.running:
            victim.stop(timeout=120)
        if "exit" not in marks:
            marks["exit"] = now_ns()
        in_log = kafka.record_count(cluster.bootstrap, topic, 1)
        if len(acks) != produced:
            errors.append(f"{len(acks)}/{produced} acknowledged")
        probes, duplicates, read = read_back(cluster.bootstrap, topic, in_log)
        state["produced"] = state.get("produced", 0) + produced
        state["probes_acked"] = state.get("probes_acked", 0) + wire.appended
        state["probes_uncertain"] = state.get("probes_uncertain", 0) + wire.uncertain
        if read != in_log:
            errors.append(f"read back {read} of {in_log} records")
        if duplicates:
            errors.append(f"{duplicates} producer records stored twice")
        if in_log - probes != state["produced"]:
            errors.append(
                f"log holds {in_log - probes} producer records, {state['produced']} produced and acknowledged"
            )
        if not state["probes_acked"] <= probes <= state["probes_acked"] + state["probes_uncertain"]:
            errors.append(
                f"log holds {probes} probe records: {state['probes_acked']} acknowledged, "
                f"{state['probes_uncertain']} answers uncertain"
            )
        ack_times = sorted(a for _p, a in acks if a >= t0 - 1_000_000_000)
        gaps = [b - a for a, b in itertools.pairwise(ack_times)]

        def since(key: str) -> float | None:
            return (marks[key] - t0) / 1e9 if key in marks else None

        rejoin_s = cluster.rejoin(victim, topic)
        return {
            "ok": not errors and "first_ack" in marks,
            "error": "; ".join(errors)[:1000],
            "failover_s": since("first_ack"),
            "gone_s": since("gone"),
            "elected_s": since("elected"),
            "metadata_s": since("metadata"),
            "wire_ack_s": since("wire_ack"),
            "exit_s": since("exit"),
            "max_gap_s": max(gaps) / 1e9 if gaps else None,
            "victim": leader,
            "new_leader": marks.get("new_leader"),
            "isr_at_election": marks.get("isr_at_election"),
            "probe_records": probes,
            "duplicates": duplicates,
            "victim_was_controller": leader == controller,
            "isr_before": len(isr),
            "records": produced,
            "session_timeout_ms": self.session_timeout_ms,
            "rejoin_s": rejoin_s,
            "load1": _load1(),
        }

    def teardown(self, ctx: Context, broker: BrokerProcess | None, state: dict[str, Any]) -> None:
        state["cluster"].stop()


@register
class FailoverKill9Short(Failover):
    name = "failover-kill9-s2"
    title = (
        "3-broker cluster: leader kill -9 -> first acked acks=all produce, zookeeper.session.timeout.ms=2000"
    )
    session_timeout_ms = 2_000
    targets = (Target("failover_s", "<=", 3.0, "s (session timeout 2 s + 1 s)", "#9"),)


@register
class FailoverKill9Default(Failover):
    name = "failover-kill9-s18"
    title = "3-broker cluster: leader kill -9 -> first acked acks=all produce, zookeeper.session.timeout.ms=18000 (default)"
    session_timeout_ms = DEFAULT_SESSION_TIMEOUT_MS
    default = False  # ~25 s per repetition, mostly waiting for the session to expire; run with --only
    targets = (Target("failover_s", "<=", 19.0, "s (session timeout 18 s + 1 s)", "#9"),)


@register
class FailoverSigterm(Failover):
    name = "failover-sigterm"
    title = "3-broker cluster: leader SIGTERM -> first acked acks=all produce (session timeout 18 s)"
    session_timeout_ms = DEFAULT_SESSION_TIMEOUT_MS
    sig = signal.SIGTERM
    # With a controlled shutdown the old leader keeps acknowledging until leadership has moved, so the
    # first ack after the signal says little: the longest stretch without any ack is the unavailability.
    targets = (Target("max_gap_s", "<=", 1.0, "s longest ack gap around SIGTERM", "#9"),)


# librdkafka's own back-offs (retry.backoff.ms 100 growing to retry.backoff.max.ms 1000, reconnects
# likewise) after it loses the leader: with them capped at 100 ms, what remains is the cluster's part.
FAST_RETRY: dict[str, object] = {
    "retry.backoff.max.ms": 100,
    "reconnect.backoff.max.ms": 100,
    "topic.metadata.refresh.fast.interval.ms": 50,
}


@register
class FailoverKill9ShortFastRetry(FailoverKill9Short):
    name = "failover-kill9-s2-fast-retry"
    title = "as failover-kill9-s2, producer with retry/reconnect back-off capped at 100 ms"
    default = False
    producer_conf = FAST_RETRY


@register
class FailoverSigtermFastRetry(FailoverSigterm):
    name = "failover-sigterm-fast-retry"
    title = "as failover-sigterm, producer with retry/reconnect back-off capped at 100 ms"
    default = False
    producer_conf = FAST_RETRY
