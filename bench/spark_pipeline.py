"""Spark benchmark (issue #4): the orders pipeline's throughput, and the exactly-once sink against
the at-least-once sink on the same data in the same run.

    .venv/bin/python bench/spark_pipeline.py                 # 200k orders, 2 rounds (~5-8 min)
    .venv/bin/python bench/spark_pipeline.py --orders 50000 --rounds 1 --out /tmp/spark-bench.md

It starts its own broker (``exactly serve`` on 127.0.0.1, data in /tmp/exactly-bench-spark-*,
deleted at the end) and one SparkSession (``local[*]``, shuffle partitions 4), writes the orders
once (transactional, every 5th transaction aborted), warms the JVM and the Python workers up on a
small separate data set, and then measures, per round (the order of EOS/ALOS alternates):

* **pipeline-eos / pipeline-alos**: the orders job (``exactly.spark.pipeline``: exactly source ->
  running totals per category and overall -> sink), ``trigger(availableNow)``,
  ``maxOffsetsPerTrigger`` = ``--batch``, from a fresh checkpoint, sink ``exactly_once`` or
  ``at_least_once``. orders/s = committed orders / sum of the micro-batches' durations (Spark's
  ``batchDuration``: query start-up excluded). The EOS run must pass ``verify``.
* **copy-eos / copy-alos**: a sink-heavy job on the same input: every order is written back through
  the sink (key, value) to a fresh topic - so the sink carries one record per input record rather
  than a handful of updates per batch. records/s as above; the read_committed output must hold
  exactly the committed orders.

The EOS/ALOS ratio is taken per round; the report shows every round and the median.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from exactly.spark.orders import Topics, create_topics, generate, read_committed, verify  # noqa: E402
from exactly.spark.pipeline import JobConfig, start  # noqa: E402
from exactly.spark.session import build_session  # noqa: E402
from exactly.testing.broker import Broker  # noqa: E402


def _measure(query: Any, timeout: float) -> dict[str, float]:
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
    return {
        "rows": rows,
        "seconds": busy,
        "wall": wall,
        "batches": len(progress),
        "rate": rows / busy if busy else 0.0,
    }


def run_pipeline(
    spark: Any, bootstrap: str, source: Topics, out_prefix: str, ckpt: Path, delivery: str, batch: int
) -> dict[str, float]:
    topics = Topics(source.orders, f"{out_prefix}category-sales", f"{out_prefix}total-sales")
    create_topics(bootstrap, topics)
    tag = uuid.uuid4().hex[:6]
    config = JobConfig(
        bootstrap=bootstrap,
        checkpoint=str(ckpt),
        topics=topics,
        max_offsets_per_trigger=batch,
        delivery=delivery,
        transactional_id_prefix=f"bench-{tag}",
        query_name=f"bench-{tag}",
    )
    result = _measure(start(spark, config), 1800)
    if delivery == "exactly_once":
        report = verify(bootstrap, topics)
        if not report.ok:
            raise RuntimeError(f"verify failed after the EOS pipeline run: {report.summary()}")
    return result


def run_copy(
    spark: Any, bootstrap: str, source: str, target: str, ckpt: Path, delivery: str, batch: int, expected: int
) -> dict[str, float]:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    admin.create_topics([NewTopic(target, num_partitions=3, replication_factor=-1)])[target].result(30)
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
    result = _measure(query, 1800)
    got = len(read_committed(bootstrap, target, timeout=300))
    if got != expected:
        raise RuntimeError(f"copy-{delivery}: {got} records in {target}, expected {expected}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--orders", type=int, default=200_000, help="committed orders (default 200k)")
    parser.add_argument("--batch", type=int, default=50_000, help="maxOffsetsPerTrigger (default 50k)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of EOS+ALOS pairs (default 2)")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown report here")
    parser.add_argument("--json", type=Path, default=None, help="write every sample as JSON here")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="exactly-bench-spark-"))
    broker = Broker(tmp / "data", tmp / "broker.log", name="bench-broker", src=ROOT / "src", cwd=ROOT).start()
    bootstrap = broker.bootstrap
    spark = None
    samples: list[dict[str, Any]] = []
    try:
        source = Topics.with_prefix("bench-")
        create_topics(bootstrap, source, partitions=3)
        made = generate(bootstrap, source, args.orders, txn_size=500, abort_every=5, seed=42)
        print(
            f"broker {bootstrap}: {made.committed} orders (+{made.aborted} aborted) written in {made.seconds:.1f}s",
            flush=True,
        )
        t0 = time.monotonic()
        spark = build_session(
            args.master, "exactly-bench", {"spark.sql.shuffle.partitions": "4"}, log_level="ERROR"
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
                        f"batches, {result['seconds']:.1f}s busy ({result['wall']:.1f}s wall): {result['rate']:,.0f}/s",
                        flush=True,
                    )
    finally:
        if spark is not None:
            spark.stop()
        broker.close()
        shutil.rmtree(tmp, ignore_errors=True)

    report = render(samples, args)
    print("\n" + report)
    if args.out is not None:
        args.out.write_text(report)
    if args.json is not None:
        args.json.write_text(json.dumps(samples, indent=2))
    return 0


def render(samples: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"## Spark pipeline (issue #4): {args.orders:,} orders, maxOffsetsPerTrigger {args.batch:,}, {args.master}",
        "",
        "| job | round | exactly_once /s | at_least_once /s | EOS/ALOS |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for job in ("pipeline", "copy"):
        ratios = []
        for rnd in sorted({s["round"] for s in samples}):
            pair = {s["delivery"]: s for s in samples if s["job"] == job and s["round"] == rnd}
            if len(pair) < 2:
                continue
            ratio = pair["exactly_once"]["rate"] / pair["at_least_once"]["rate"]
            ratios.append(ratio)
            lines.append(
                f"| {job} | {rnd} | {pair['exactly_once']['rate']:,.0f} | {pair['at_least_once']['rate']:,.0f} | {ratio:.2f} |"
            )
        if ratios:
            eos = statistics.median(
                s["rate"] for s in samples if s["job"] == job and s["delivery"] == "exactly_once"
            )
            alos = statistics.median(
                s["rate"] for s in samples if s["job"] == job and s["delivery"] == "at_least_once"
            )
            lines.append(
                f"| **{job} median** | | **{eos:,.0f}** | **{alos:,.0f}** | **{statistics.median(ratios):.2f}** |"
            )
    lines += [
        "",
        "pipeline: orders/s through the orders job (source -> running totals -> sink); copy: records/s",
        "written one-for-one through the sink. Rate = records / sum of micro-batch durations. Target: EOS/ALOS >= 0.9.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
