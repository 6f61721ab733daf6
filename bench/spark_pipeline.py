"""Spark benchmark: the orders pipeline's throughput, the exactly-once sink against the
at-least-once sink on the same data in the same run, the end-to-end latency of a small
micro-batch, and where each micro-batch's time goes.

    .venv/bin/python bench/spark_pipeline.py                 # 400k orders, batches of 100k offsets, 2 rounds (~4-6 min)
    .venv/bin/python bench/spark_pipeline.py --orders 50000 --batch 50000 --rounds 1 --out /tmp/spark-bench.md

It starts its own broker (``exactly serve`` on 127.0.0.1 with two-phase commit allowed, so the
exactly-once sink runs in its default atomic mode; data in /tmp/exactly-bench-spark-*, deleted at
the end) and one SparkSession (``local[*]``, ``--shuffle-partitions``), writes the orders once
(transactional, every 5th transaction aborted), warms the JVM and the Python workers up on a small
separate data set, and then measures, per round (the order of EOS/ALOS alternates):

* **pipeline-eos / pipeline-alos**: the orders job (``exactly.spark.pipeline``: exactly source ->
  running totals per category and overall -> sink), ``trigger(availableNow)``,
  ``maxOffsetsPerTrigger`` = ``--batch``, from a fresh checkpoint, sink ``exactly_once`` (atomic
  two-phase batches) or ``at_least_once``. orders/s = committed orders / sum of the micro-batches'
  durations (Spark's ``batchDuration``: query start-up excluded); "warm" = the same over the
  batches after the first (the first pays the new query's set-up: state store, producers, plans).
  The EOS run must pass ``verify``. The targets speak of *large* batches: the defaults make every
  run several micro-batches of ~80,000 orders (100,000 offsets: the input has aborted
  transactions and their markers), so Spark's fixed per-trigger cost (~0.5-0.7 s of scheduling,
  planning, offset and commit logs) no longer dominates; ``--batch 50000 --orders 50000`` is the
  earlier, small-batch measurement.
* **copy-eos / copy-alos**: a sink-heavy job on the same input: every order is written back through
  the sink (key, value) to a fresh topic - so the sink carries one record per input record rather
  than a handful of updates per batch. records/s as above; the read_committed output must hold
  exactly the committed orders.
* **latency**: the orders job (EOS) with micro-batches of ``--latency-batch`` orders; a
  read_committed reader of total-sales notes when each batch's update becomes visible; latency =
  that moment minus the trigger's start (the progress report's ``timestamp``). p50 over the
  batches after the first (warm).

The EOS/ALOS ratio is taken per round; the report shows every round and the median, the targets,
and one where-the-time-goes table per run of the last round (``benchlib/spark_breakdown.py``: the
progress report's durations plus the connector's own timers, ``exactly.spark.timings``), whose
last line is each column's microseconds per row over the warm batches. The load average is
noted at every run: other work on the machine slows both sides of a pair alike, but not the
absolute rates.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from confluent_kafka import TopicPartition  # noqa: E402

from benchlib.spark_breakdown import batch_rows, render_table  # noqa: E402
from benchlib.spark_setup import output_watcher, start_broker  # noqa: E402
from exactly.spark.orders import Topics, create_topics, generate, read_committed, verify  # noqa: E402
from exactly.spark.pipeline import JobConfig, start  # noqa: E402
from exactly.spark.session import build_session  # noqa: E402

try:  # an older checkout (A/B runs against it) has no connector timers: the table is then empty
    from exactly.spark import timings
except ImportError:  # pragma: no cover
    timings = None  # type: ignore[assignment]

TIMINGS_ENV = "EXACTLY_SPARK_TIMINGS"
TARGET_RATE = 50_000
TARGET_RATIO = 0.9
TARGET_LATENCY_S = 1.0


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def tree_cpu_seconds(root: int | None = None) -> dict[str, float]:
    """CPU seconds (user + system) used so far by ``root`` (this process) and every descendant,
    by kind: ``broker``, ``jvm`` (Spark), ``python`` (Spark's Python workers and this process)
    and their ``total``. Children that ended are in their reaped parent's cutime/cstime. Unlike a
    rate, this does not depend on what else the machine runs (beyond cache and scheduling
    effects), so it compares runs made under different loads."""
    root = os.getpid() if root is None else root
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    kinds: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                head, tail = f.read().rsplit(")", 1)
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ")
        except OSError:
            continue
        fields = tail.split()
        pid = int(entry)
        parents[pid] = int(fields[1])
        times[pid] = sum(int(x) for x in fields[11:15]) / _TICK
        if b"exactly serve" in cmdline:
            kinds[pid] = "broker"
        elif b"java" in head.encode() or cmdline.startswith(b"java") or b"/java " in cmdline:
            kinds[pid] = "jvm"
        else:
            kinds[pid] = "python"
    totals = {"broker": 0.0, "jvm": 0.0, "python": 0.0}
    for pid in times:
        p = pid
        while p > 1 and p != root:
            p = parents.get(p, 0)
        if p == root:
            totals[kinds[pid]] += times[pid]
    totals["total"] = sum(totals.values())
    return totals


def _measure(query: Any, timeout: float, cpu_before: dict[str, float]) -> dict[str, Any]:
    started = time.monotonic()
    if not query.awaitTermination(timeout):
        query.stop()
        raise RuntimeError(f"query did not finish within {timeout}s")
    wall = time.monotonic() - started
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    progress = [p for p in query.recentProgress if p.get("numInputRows")]
    rows = sum(int(p["numInputRows"]) for p in progress)
    busy = sum(float(p.get("batchDuration", 0)) for p in progress) / 1000.0
    cpu_after = tree_cpu_seconds()
    cpu = {kind: cpu_after[kind] - cpu_before[kind] for kind in cpu_after}
    warm_rows = sum(int(p["numInputRows"]) for p in progress[1:])
    warm_busy = sum(float(p.get("batchDuration", 0)) for p in progress[1:]) / 1000.0
    return {
        "rows": rows,
        "seconds": busy,
        "wall": wall,
        "batches": len(progress),
        "rate": rows / busy if busy else 0.0,
        "warm_rate": warm_rows / warm_busy if warm_busy else 0.0,
        "load": os.getloadavg()[0],
        "cpu_s": cpu,
        "cpu_us_per_row": cpu["total"] / rows * 1e6 if rows else 0.0,
        "cpu_us_per_row_by_kind": {k: v / rows * 1e6 for k, v in cpu.items()} if rows else {},
        "progress": [json.loads(p.json) if hasattr(p, "json") else dict(p) for p in progress],
    }


def _config(bootstrap: str, topics: Topics, ckpt: Path, delivery: str, batch: int) -> JobConfig:
    tag = uuid.uuid4().hex[:6]
    return JobConfig(
        bootstrap=bootstrap,
        checkpoint=str(ckpt),
        topics=topics,
        max_offsets_per_trigger=batch,
        delivery=delivery,
        transactional_id_prefix=f"bench-{tag}",
        query_name=f"bench-{tag}",
    )


def run_pipeline(
    spark: Any, bootstrap: str, source: Topics, out_prefix: str, ckpt: Path, delivery: str, batch: int
) -> dict[str, Any]:
    topics = Topics(source.orders, f"{out_prefix}category-sales", f"{out_prefix}total-sales")
    create_topics(bootstrap, topics)
    cpu = tree_cpu_seconds()
    result = _measure(start(spark, _config(bootstrap, topics, ckpt, delivery, batch)), 1800, cpu)
    if delivery == "exactly_once":
        report = verify(bootstrap, topics)
        if not report.ok:
            raise RuntimeError(f"verify failed after the EOS pipeline run: {report.summary()}")
    return result


def run_copy(
    spark: Any, bootstrap: str, source: str, target: str, ckpt: Path, delivery: str, batch: int, expected: int
) -> dict[str, Any]:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    admin.create_topics([NewTopic(target, num_partitions=3, replication_factor=-1)])[target].result(30)
    cpu = tree_cpu_seconds()
    query = (
        spark.readStream.format("exactly")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(batch))
        .load()
        .selectExpr("key", "value")
        .writeStream.format("exactly")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", target)
        .option("deliveryGuarantee", delivery)
        .option("transactionalIdPrefix", f"bench-copy-{uuid.uuid4().hex[:6]}")
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )
    result = _measure(query, 1800, cpu)
    got = len(read_committed(bootstrap, target, timeout=300))
    if got != expected:
        raise RuntimeError(f"copy-{delivery}: {got} records in {target}, expected {expected}")
    return result


class _VisibleAt(threading.Thread):
    """Reads total-sales under read_committed; remembers when each batch's update became visible."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.consumer = output_watcher(bootstrap, "latency")
        self.consumer.assign([TopicPartition(topic, 0, 0)])
        self.seen: dict[int, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                for m in self.consumer.consume(num_messages=100, timeout=0.005):
                    if m.error() is None:
                        batch = int(json.loads(m.value() or b"{}")["batch"])
                        self.seen.setdefault(batch, time.time())
        finally:
            self.consumer.close()


def run_latency(spark: Any, bootstrap: str, source: Topics, ckpt: Path, batch: int) -> dict[str, Any]:
    topics = Topics(source.orders, "latency-category-sales", "latency-total-sales")
    create_topics(bootstrap, topics)
    reader = _VisibleAt(bootstrap, topics.total)
    reader.start()
    try:
        cpu = tree_cpu_seconds()
        result = _measure(start(spark, _config(bootstrap, topics, ckpt, "exactly_once", batch)), 1800, cpu)
        deadline = time.monotonic() + 30
        wanted = {int(p["batchId"]) for p in result["progress"]}
        while not wanted <= set(reader.seen) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        reader.stop.set()
        reader.join(10)
    latencies = []
    for p in result["progress"]:
        seen = reader.seen.get(int(p["batchId"]))
        if seen is not None:
            triggered = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
            latencies.append(seen - triggered)
    result["latencies"] = latencies
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--orders", type=int, default=400_000, help="committed orders (default 400k)")
    parser.add_argument(
        "--batch", type=int, default=100_000, help="maxOffsetsPerTrigger (default 100k: ~80k orders)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds of EOS+ALOS pairs (default 2)")
    parser.add_argument("--latency-batch", type=int, default=5_000, help="orders per latency micro-batch")
    parser.add_argument("--latency-batches", type=int, default=8, help="latency micro-batches (first = warm)")
    parser.add_argument("--shuffle-partitions", type=int, default=2, help="spark.sql.shuffle.partitions")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown report here")
    parser.add_argument("--json", type=Path, default=None, help="write every sample as JSON here")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="exactly-bench-spark-"))
    timing_dir = tmp / "timings"
    timing_dir.mkdir()
    os.environ[TIMINGS_ENV] = str(timing_dir)  # inherited by the JVM and its Python workers
    broker = start_broker(tmp)
    bootstrap = broker.bootstrap
    spark = None
    samples: list[dict[str, Any]] = []
    latency: dict[str, Any] = {}
    connector_lines: list[dict[str, Any]] = []
    load = [os.getloadavg()]
    try:
        source = Topics.with_prefix("bench-")
        create_topics(bootstrap, source, partitions=3)
        made = generate(bootstrap, source, args.orders, txn_size=500, abort_every=5, seed=42)
        print(
            f"broker {bootstrap}: {made.committed} orders (+{made.aborted} aborted) written in {made.seconds:.1f}s",
            flush=True,
        )
        lat_source = Topics.with_prefix("latency-in-")
        create_topics(bootstrap, lat_source, partitions=3)
        generate(bootstrap, lat_source, args.latency_batch * args.latency_batches, txn_size=500, seed=7)
        t0 = time.monotonic()
        spark = build_session(
            args.master,
            "exactly-bench",
            {"spark.sql.shuffle.partitions": str(args.shuffle_partitions)},
            log_level="ERROR",
            quick_jvm=False,  # a throughput series: the JVM's full JIT, as in the earlier results
        )
        print(f"Spark up in {time.monotonic() - t0:.1f}s; warming up", flush=True)
        warm = Topics.with_prefix("warm-")
        create_topics(bootstrap, warm, partitions=3)
        generate(bootstrap, warm, 3000, txn_size=500, abort_every=5, seed=1)
        for delivery in ("exactly_once", "at_least_once"):
            run_pipeline(
                spark, bootstrap, warm, f"warm-{delivery}-", tmp / f"ckpt-warm-{delivery}", delivery, 1000
            )
            run_copy(
                spark,
                bootstrap,
                warm.orders,
                f"warm-copy-{delivery}",
                tmp / f"ckpt-warm-copy-{delivery}",
                delivery,
                1000,
                3000,
            )
        load.append(os.getloadavg())
        for rnd in range(args.rounds):
            order = ("exactly_once", "at_least_once") if rnd % 2 == 0 else ("at_least_once", "exactly_once")
            for job in ("pipeline", "copy"):
                for delivery in order:
                    tag = f"r{rnd}-{job}-{delivery}"
                    if job == "pipeline":
                        result = run_pipeline(
                            spark, bootstrap, source, f"{tag}-", tmp / f"ckpt-{tag}", delivery, args.batch
                        )
                    else:
                        result = run_copy(
                            spark,
                            bootstrap,
                            source.orders,
                            f"{tag}-out",
                            tmp / f"ckpt-{tag}",
                            delivery,
                            args.batch,
                            made.committed,
                        )
                    sample = {"round": rnd, "job": job, "delivery": delivery, **result}
                    samples.append(sample)
                    print(
                        f"round {rnd} {job:<8} {delivery:<13}: {result['rows']:.0f} records in {result['batches']:.0f} "
                        f"batches, {result['seconds']:.1f}s busy ({result['wall']:.1f}s wall): {result['rate']:,.0f}/s "
                        f"(warm {result['warm_rate']:,.0f}/s), load {result['load']:.1f}, "
                        f"{result['cpu_us_per_row']:.0f} CPU-us/record ("
                        + ", ".join(
                            f"{k} {v:.0f}"
                            for k, v in result["cpu_us_per_row_by_kind"].items()
                            if k != "total"
                        )
                        + ")",
                        flush=True,
                    )
        latency = run_latency(spark, bootstrap, lat_source, tmp / "ckpt-latency", args.latency_batch)
        print(f"latency per micro-batch (s): {[round(x, 3) for x in latency['latencies']]}", flush=True)
        load.append(os.getloadavg())
        cores = spark.sparkContext.defaultParallelism
        lines = timings.load(timing_dir) if timings is not None else []
        for sample in samples:
            sample["breakdown"] = batch_rows(sample["progress"], lines, cores)
        latency["breakdown"] = batch_rows(latency["progress"], lines, cores)
        connector_lines = lines  # every timed section (the sink's init/lookup/produce/flush/prepare...)
    finally:
        if spark is not None:
            spark.stop()
        broker.close()
        shutil.rmtree(tmp, ignore_errors=True)

    report = render(samples, latency, load, args)
    print("\n" + report)
    if args.out is not None:
        args.out.write_text(report)
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {"samples": samples, "latency": latency, "load": load, "timings": connector_lines}, indent=2
            )
        )
    return 0


def _mark(ok: bool) -> str:
    return "met" if ok else "**not met**"


def render(
    samples: list[dict[str, Any]],
    latency: dict[str, Any],
    load: list[tuple[float, ...]],
    args: argparse.Namespace,
) -> str:
    lines = [
        f"## Spark pipeline: {args.orders:,} orders, maxOffsetsPerTrigger {args.batch:,}, {args.master}, "
        f"shuffle partitions {args.shuffle_partitions}",
        "",
        "Load average (1/5/15 min) at start, after the warm-up, at the end: "
        + "; ".join("/".join(f"{x:.2f}" for x in la) for la in load),
        "",
        "| job | round | exactly_once (atomic) /s | at_least_once /s | EOS/ALOS | EOS warm /s | ALOS warm /s "
        "| load (EOS, ALOS) | CPU-us/record (EOS, ALOS) | CPU ALOS/EOS |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: |",
    ]
    medians: dict[str, tuple[float, float, float]] = {}
    for job in ("pipeline", "copy"):
        ratios = []
        for rnd in sorted({s["round"] for s in samples}):
            pair = {s["delivery"]: s for s in samples if s["job"] == job and s["round"] == rnd}
            if len(pair) < 2:
                continue
            ratio = pair["exactly_once"]["rate"] / pair["at_least_once"]["rate"]
            ratios.append(ratio)
            eos_run, alos_run = pair["exactly_once"], pair["at_least_once"]
            lines.append(
                f"| {job} | {rnd} | {eos_run['rate']:,.0f} | {alos_run['rate']:,.0f} | {ratio:.2f} "
                f"| {eos_run.get('warm_rate', 0):,.0f} | {alos_run.get('warm_rate', 0):,.0f} "
                f"| {eos_run.get('load', 0):.1f}, {alos_run.get('load', 0):.1f} "
                f"| {eos_run.get('cpu_us_per_row', 0):.0f}, {alos_run.get('cpu_us_per_row', 0):.0f} "
                f"| {alos_run.get('cpu_us_per_row', 0) / max(eos_run.get('cpu_us_per_row', 0), 1e-9):.2f} |"
            )
        if ratios:
            eos = statistics.median(
                s["rate"] for s in samples if s["job"] == job and s["delivery"] == "exactly_once"
            )
            alos = statistics.median(
                s["rate"] for s in samples if s["job"] == job and s["delivery"] == "at_least_once"
            )
            medians[job] = (eos, alos, statistics.median(ratios))
            lines.append(
                f"| **{job} median** | | **{eos:,.0f}** | **{alos:,.0f}** | **{statistics.median(ratios):.2f}** "
                "| | | | | |"
            )
    warm_latencies = latency.get("latencies", [])[1:]
    p50 = statistics.median(warm_latencies) if warm_latencies else float("nan")
    lines += [
        "",
        "pipeline: orders/s through the orders job (source -> running totals -> sink); copy: records/s",
        "written one-for-one through the sink. Rate = records / sum of micro-batch durations (warm: of",
        "the batches after the first). Load: the 1-minute load average when the run ended. CPU-us/record:",
        "CPU time of the whole process tree (broker, Spark JVM, Python workers) per record during the",
        "run - independent of the load, so EOS/ALOS and before/after compare on it when the box is busy.",
        "",
        "### Targets",
        "",
        "| target | measured | |",
        "| --- | ---: | --- |",
    ]
    for job, unit in (("pipeline", "orders/s"), ("copy", "records/s")):
        if job in medians:
            eos, _alos, ratio = medians[job]
            lines.append(
                f"| {job} EOS >= {TARGET_RATE:,} {unit} | {eos:,.0f} | {_mark(eos >= TARGET_RATE)} |"
            )
            lines.append(
                f"| {job} EOS/ALOS >= {TARGET_RATIO} | {ratio:.2f} | {_mark(ratio >= TARGET_RATIO)} |"
            )
    lines.append(
        f"| micro-batch of {args.latency_batch:,} orders, trigger to visible, p50 <= {TARGET_LATENCY_S:.0f} s "
        f"(warm, {len(warm_latencies)} batches) | {p50:.3f} s | {_mark(p50 <= TARGET_LATENCY_S)} |"
    )
    lines += ["", "### Where the time goes, per micro-batch", ""]
    last = max((s["round"] for s in samples), default=0)
    for s in samples:
        if s["round"] == last:
            lines += render_table(f"{s['job']} {s['delivery']} (round {last})", s.get("breakdown", []))
    lines += render_table(
        f"latency: pipeline exactly_once, batches of {args.latency_batch:,}", latency.get("breakdown", [])
    )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
