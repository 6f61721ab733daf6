"""Transactions on the replicated cluster (issue #10): transactional / idempotent throughput with a commit
every 100 ms, transaction commit latency on RF 3 vs RF 1, and the time from kill -9 of the transaction
coordinator's broker to the next successful ``commit_transaction()``.

Every workload starts its own ZooKeeper + 3 brokers (bench/benchlib/cluster.py, as the #9 workloads in
bench/benchlib/cluster_workloads.py) with ``transaction.state.log.num.partitions=1``: one
``__transaction_state`` partition, so every transactional id has the same coordinator, the leader of
that partition (Kafka's TransactionsBounceTest shape).

Every run checks what it moved: the throughput pair counts the log (ListOffsets at read_committed = the
records plus one COMMIT marker per transaction, and the last stable offset equal to the high watermark:
no transaction left open); the latency and coordinator runs read the topic back with
``isolation.level=read_committed`` and require every record of every committed transaction exactly once
and nothing of an aborted one.
"""

from __future__ import annotations

import struct
import time
from collections import Counter
from typing import Any, ClassVar

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Producer, TopicPartition

from benchlib import drivers, kafka
from benchlib.brokers import BrokerProcess
from benchlib.cluster import Cluster
from benchlib.cluster_workloads import (
    LEADER,
    _leader_process,
    _place,
    _start_cluster,
    run_alternating,
)
from benchlib.workloads import (
    Context,
    Meter,
    Target,
    Workload,
    percentile,
    register,
    throughput_sample,
)
from exactly.client.broker_pool import COORDINATOR_TYPE_TRANSACTION, FIND_COORDINATOR_MAX_VERSION
from exactly.client.wire import ApiKey, WireClient, WireError, error_name
from exactly.topics import TRANSACTION_STATE_TOPIC

# The RF 1 reference cluster: the same three brokers, but the transaction log (and the group log) with
# one replica, so neither the coordinator's log appends nor the markers wait for a follower.
RF1_INTERNAL = {
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "offsets.topic.replication.factor": "1",
}
TXN_STATE_STATE_ZNODE = f"/brokers/topics/{TRANSACTION_STATE_TOPIC}/partitions/0/state"


# ------------------------------------------------------------------------------------------ helpers


def find_coordinator(client: WireClient, transactional_id: str) -> tuple[int, str]:
    """FindCoordinator(transaction) over ``client``: (node id, error name); node -1 with an error."""
    version = client.version_for(ApiKey.FIND_COORDINATOR, FIND_COORDINATOR_MAX_VERSION)
    r = client.call(
        ApiKey.FIND_COORDINATOR, version, key=transactional_id, key_type=COORDINATOR_TYPE_TRANSACTION
    )
    code = int(r.error_code)
    return (int(r.node_id) if code == 0 else -1), error_name(code)


def coordinator_of(cluster: Cluster, transactional_id: str, timeout: float = 60.0) -> int:
    """The coordinator's broker id, asked of the running brokers in turn until one answers without error."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    for _ in range(100_000):
        for b in cluster.running():
            try:
                with WireClient.connect(b.bootstrap, timeout=5, client_id="bench-coordinator") as c:
                    node, code = find_coordinator(c, transactional_id)
            except WireError as exc:
                last = str(exc)
                continue
            if node >= 0:
                return node
            last = code
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    raise RuntimeError(f"no coordinator for {transactional_id} after {timeout:.0f} s: {last}")


def stable_and_high(bootstrap: str, topic: str) -> tuple[int, int, int]:
    """(log start, last stable offset, high watermark) of partition 0: ListOffsets at read_committed and
    at read_uncommitted."""
    out = []
    for level in ("read_committed", "read_uncommitted"):
        c = kafka.consumer(bootstrap, {"isolation.level": level})
        try:
            out.append(c.get_watermark_offsets(TopicPartition(topic, 0), timeout=30, cached=False))
        finally:
            c.close()
    (start, lso), (_start, hw) = out
    return start, lso, hw


def txn_value(txn: int, index: int, pad: bytes) -> bytes:
    """A record of transaction ``txn``: its number and index up front, so a read-back can tell them apart."""
    return struct.pack(">QI", txn, index) + pad[12:]


def read_committed(
    bootstrap: str, topic: str, expected: int, timeout: float = 120.0
) -> Counter[tuple[int, int]]:
    """Partition 0 from the start at ``isolation.level=read_committed`` up to the last stable offset:
    how often each (transaction, index) was delivered.  Stops at end of partition once ``expected``
    records arrived (or 5 s after end of partition if fewer did: what is missing stays missing)."""
    c = kafka.consumer(bootstrap, {"isolation.level": "read_committed", "enable.partition.eof": True})
    seen: Counter[tuple[int, int]] = Counter()
    read = 0
    try:
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + timeout
        eof_at: float | None = None
        while time.monotonic() < deadline:
            if eof_at is not None and (read >= expected or time.monotonic() - eof_at > 5):
                break
            for m in c.consume(1000, 0.5):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF and eof_at is None:
                        eof_at = time.monotonic()
                    continue
                read += 1
                seen[struct.unpack_from(">QI", m.value())] += 1
    finally:
        c.close()
    return seen


def check_read_back(
    seen: Counter[tuple[int, int]], committed: set[int], per_txn: int, aborted: set[int]
) -> list[str]:
    """Every record of every committed transaction exactly once, nothing else."""
    errors: list[str] = []
    txns = Counter(t for t, _i in seen)
    lost = sorted(t for t in committed if txns[t] != per_txn)
    dup = sum(n - 1 for n in seen.values() if n > 1)
    foreign = sorted(t for t in txns if t not in committed)
    if lost:
        errors.append(f"{len(lost)} committed transactions not read back whole (first {lost[:5]})")
    if dup:
        errors.append(f"{dup} records read back more than once")
    if foreign:
        leaked = [t for t in foreign if t in aborted]
        errors.append(
            f"{len(foreign)} transactions read back that were not committed ({len(leaked)} of them aborted)"
        )
    return errors


# --------------------------------------------------------------------------------------- throughput


@register
class ClusterTxnVsIdempotent(Workload):
    """``txn-produce-p1`` on the cluster: the confluent-kafka produce loop (1 KB, acks=all, linger.ms=10,
    1 MB batches), ``ctx.records * ctx.pair_factor`` records, once idempotent and once transactional
    with ``commit_transaction()`` every 100 ms, back to back in each repetition (order alternating), each
    to a fresh RF 3 topic (min.insync.replicas=2) led by broker 0.  The transaction log is RF 3 as well
    (the cluster default), so each commit waits for PrepareCommit to be replicated, the markers to be
    written (replicated) on the data partition's leader and CompleteCommit.  ratio = txn MB/s / idem MB/s.
    CPU summed over the three brokers."""

    name = "cluster-txn-produce-p1"
    kind = "cluster-txn-pair"
    title = "3-broker cluster: transactional (commit every 100 ms) / idempotent produce, 1 KB, RF 3 acks=all"
    peer_ok = False
    own_broker = True
    interval_s: ClassVar[float] = 0.1
    targets = (Target("ratio", ">=", 0.95, "txn / idempotent MB/s on the cluster (RF 3)", "#10"),)

    def repeats(self, ctx: Context) -> int:
        return ctx.repeat if ctx.quick else ctx.repeat + 2

    def setup(self, ctx: Context, broker: BrokerProcess | None) -> dict[str, Any]:
        cluster = _start_cluster(ctx, "txn-produce")
        try:
            warmup = _place(cluster, "bench-warmup", 1)
        except BaseException:
            cluster.stop()
            raise
        return {"cluster": cluster, "warmup": warmup}

    def measured_broker(self, broker: BrokerProcess | None, state: Any) -> BrokerProcess | None:
        return _leader_process(state["cluster"]) if isinstance(state, dict) else broker

    def _one(self, ctx: Context, state: dict[str, Any], mode: str, rep: int) -> dict[str, Any]:
        cluster: Cluster = state["cluster"]
        topic = _place(cluster, f"{self.name}-{mode}", 3)
        records = ctx.records * ctx.pair_factor
        txn = mode == "txn"
        tid = f"bench-{topic}"
        with Meter(cluster) as meter:
            run = drivers.confluent_produce(
                cluster.bootstrap,
                topic,
                records,
                ctx.pool,
                ctx.timeout_for(records * len(ctx.pool[0])),
                conf={"transactional.id": tid} if txn else None,
                warmup_topic=state["warmup"],
                txn_interval_s=self.interval_s if txn else None,
            )
        start, lso, hw = stable_and_high(cluster.bootstrap, topic)
        markers = lso - start - run.records
        commits = int(run.extra.get("commits", 0)) if txn else 0
        if markers != commits:
            run.errors.append(
                f"log holds {lso - start} offsets up to the LSO for {run.records} records: {markers} "
                f"control records, expected {commits} (one COMMIT marker per transaction)"
            )
        if lso != hw:
            run.errors.append(f"last stable offset {lso} < high watermark {hw}: a transaction left open")
        sample = throughput_sample(run, meter, records)
        sample["offsets_in_log"] = lso - start
        if txn:
            sample["coordinator"] = coordinator_of(cluster, tid)
        cluster.delete_topic(topic)
        return sample

    def run_once(
        self, ctx: Context, broker: BrokerProcess | None, state: dict[str, Any], rep: int
    ) -> dict[str, Any]:
        parts: dict[str, dict[str, Any]] = {}

        def one(mode: str) -> dict[str, Any]:
            parts[mode] = self._one(ctx, state, mode, rep)
            return parts[mode]

        out = run_alternating(["idem", "txn"], rep, one)
        a, b = parts["txn"], parts["idem"]
        out["ratio"] = a["mb_s"] / b["mb_s"] if b["mb_s"] else None
        out["cpu_ratio"] = (
            a["broker_cpu_s_per_gb"] / b["broker_cpu_s_per_gb"]
            if a.get("broker_cpu_s_per_gb") and b.get("broker_cpu_s_per_gb")
            else None
        )
        out["coordinator_is_leader"] = a.get("coordinator") == LEADER
        return out

    def teardown(self, ctx: Context, broker: BrokerProcess | None, state: dict[str, Any]) -> None:
        state["cluster"].stop()


# ------------------------------------------------------------------------------------ commit latency


def commit_latency(
    ctx: Context, cluster: Cluster, topic: str, interval_s: float, per_txn: int
) -> dict[str, Any]:
    """Transactions of ``per_txn`` 1 KB records begun every ``interval_s`` for ``ctx.latency_seconds``:
    begin, produce, ``flush()`` (the records acked: acks=all), then ``commit_transaction()`` -- timed
    apart, so *commit* is EndTxn alone (PrepareCommit logged, markers, CompleteCommit as the broker
    orders them) and *flush* the data's own acks=all round.  Five untimed transactions first (the
    coordinator's first AddPartitionsToTxn, connections)."""
    tid = f"bench-{topic}"
    p = Producer(
        {
            "bootstrap.servers": cluster.bootstrap,
            **drivers.PRODUCE_CONF,
            "linger.ms": 0,
            "transactional.id": tid,
            **kafka.QUIET,
        }
    )
    pad = ctx.pool[0]
    warm = 5
    total = warm + max(10, int(ctx.latency_seconds / interval_s))
    flush_ms: list[float] = []
    commit_ms: list[float] = []
    both_ms: list[float] = []
    errors: list[str] = []
    committed: set[int] = set()
    clock = time.perf_counter
    p.list_topics(topic, timeout=30)
    p.init_transactions(60)
    coordinator = coordinator_of(cluster, tid)
    with Meter(cluster) as meter:
        try:
            for t in range(total):
                began = clock()
                p.begin_transaction()
                for i in range(per_txn):
                    p.produce(topic, txn_value(t, i, pad))
                t1 = clock()
                if p.flush(30):
                    errors.append(f"transaction {t}: records not acked in 30 s")
                    break
                t2 = clock()
                p.commit_transaction(30)
                t3 = clock()
                committed.add(t)
                if t >= warm:
                    flush_ms.append(1000 * (t2 - t1))
                    commit_ms.append(1000 * (t3 - t2))
                    both_ms.append(1000 * (t3 - t1))
                left = began + interval_s - clock()
                if left > 0:
                    time.sleep(left)
        except KafkaException as exc:
            errors.append(f"transaction failed: {exc}")
    seen = read_committed(cluster.bootstrap, topic, len(committed) * per_txn)
    errors += check_read_back(seen, committed, per_txn, set())
    start, lso, hw = stable_and_high(cluster.bootstrap, topic)
    if lso - start != len(committed) * (per_txn + 1):
        errors.append(
            f"log holds {lso - start} offsets up to the LSO, expected {len(committed)} x ({per_txn} records "
            "+ 1 COMMIT marker)"
        )
    if lso != hw:
        errors.append(f"last stable offset {lso} < high watermark {hw}")
    sample: dict[str, Any] = {
        "ok": not errors,
        "error": "; ".join(errors)[:1000],
        "commits": len(commit_ms),
        "coordinator": coordinator,
        "coordinator_is_leader": coordinator == LEADER,
        "wall_s": meter.wall,
        "broker_cores": meter.broker_cpu / meter.wall if meter.wall else 0.0,
    }
    for label, vals in (("commit", commit_ms), ("flush", flush_ms), ("both", both_ms)):
        vals.sort()
        sample[f"{label}_p50_ms"] = percentile(vals, 50)
        sample[f"{label}_p99_ms"] = percentile(vals, 99)
        sample[f"{label}_max_ms"] = vals[-1] if vals else None
    return sample


@register
class ClusterTxnCommitLatency(Workload):
    """Transaction commit latency, RF 3 vs RF 1, back to back in each repetition (order alternating):
    a transaction of 100 x 1 KB records begun every 100 ms (1,000 msg/s, as ``cluster-latency-1k``) for
    ``--latency-seconds``.  **rf3**: the default cluster (``__transaction_state`` RF 3 with
    ``transaction.state.log.min.isr`` 2) and an RF 3 data topic (min.insync.replicas=2) led by broker 0;
    **rf1**: a second 3-broker cluster, started beside the first for the whole workload, whose transaction
    log has one replica (``transaction.state.log.replication.factor=1``, ``min.isr`` 1), and an RF 1 data
    topic led by broker 0 -- the same processes and code paths, nothing waits for a follower.  The
    coordinator is wherever the transaction log's only partition is led (reported)."""

    name = "cluster-txn-commit-latency"
    kind = "cluster-txn-latency"
    title = "3-broker cluster: transaction commit latency (EndTxn after flush), RF 3 vs RF 1, 100 x 1 KB every 100 ms"
    peer_ok = False
    own_broker = True
    interval_s: ClassVar[float] = 0.1
    per_txn: ClassVar[int] = 100

    def setup(self, ctx: Context, broker: BrokerProcess | None) -> dict[str, Any]:
        rf3 = _start_cluster(ctx, "txn-latency-rf3")
        try:
            rf1 = _start_cluster(ctx, "txn-latency-rf1", extra=RF1_INTERNAL)
        except BaseException:
            rf3.stop()
            raise
        return {"rf3": rf3, "rf1": rf1}

    def measured_broker(self, broker: BrokerProcess | None, state: Any) -> BrokerProcess | None:
        return _leader_process(state["rf3"]) if isinstance(state, dict) else broker

    def run_once(
        self, ctx: Context, broker: BrokerProcess | None, state: dict[str, Any], rep: int
    ) -> dict[str, Any]:
        def one(v: str) -> dict[str, Any]:
            cluster: Cluster = state[v]
            topic = _place(cluster, self.name, 3 if v == "rf3" else 1)
            part = commit_latency(ctx, cluster, topic, self.interval_s, self.per_txn)
            cluster.delete_topic(topic)
            return part

        return run_alternating(["rf1", "rf3"], rep, one)

    def teardown(self, ctx: Context, broker: BrokerProcess | None, state: dict[str, Any]) -> None:
        state["rf1"].stop()
        state["rf3"].stop()
