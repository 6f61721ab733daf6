"""``exactly pipeline generate|run|verify``: the orders example on Spark.

* ``generate`` writes order-completed events (transactional by default, some transactions aborted
  on purpose - they must never be counted), creating the topics if needed.
* ``run`` starts the Structured Streaming job (exactly source -> running totals -> exactly-once
  sink) with a checkpoint; ``--trigger availableNow`` (default) stops when caught up,
  ``--trigger processingTime:5s`` runs until Ctrl-C, ``--timeout`` or ``--until-caught-up``.
  ``--master`` (default ``local[*]``, or spark-submit's ``--master`` when spark-submit runs the
  command) runs the same job on a cluster.
* ``demo`` does it all on brokers of its own (``make run``): one embedded broker, or with
  ``--cluster 3`` ZooKeeper + 3 replicated brokers, optionally ``--kill-broker-after N`` (kill -9
  of a broker mid-run, restarted later); see ``exactly.cli.pipeline_demo``.
* ``verify`` recomputes the truth from the committed input and checks the outputs; exit 1 if not OK.

Works against exactly or any Kafka-compatible broker.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import Any

from exactly.cli import pipeline_demo
from exactly.cli.common import add_connection_options, guarded, positive_int, strict
from exactly.cli.progress import progress
from exactly.cli.security_options import security_config


def register(subparsers: Any) -> None:
    parser = strict(
        subparsers.add_parser("pipeline", help="the orders example on Spark (generate, run, verify)")
    )
    sub = parser.add_subparsers(dest="pipeline_command", metavar="ACTION")
    sub.required = True

    gen = strict(sub.add_parser("generate", help="write order-completed events"))
    _common(gen)
    gen.add_argument("--orders", type=positive_int, default=20_000, help="committed orders to write")
    gen.add_argument("--mode", choices=("transactional", "idempotent"), default="transactional")
    gen.add_argument("--txn-size", type=positive_int, default=200, help="orders per transaction")
    gen.add_argument("--abort-every", type=int, default=5, help="abort every Nth transaction (0: never)")
    gen.add_argument(
        "--partitions", type=positive_int, default=3, help="order-completed partitions if created"
    )
    gen.add_argument("--seed", type=int, default=7)
    gen.add_argument("--first-order-id", type=int, default=0)
    _quiet(gen)
    gen.set_defaults(func=_generate)

    run = strict(sub.add_parser("run", help="run the Structured Streaming job"))
    _common(run)
    run.add_argument("--checkpoint", required=True, help="checkpoint location (keep it to resume)")
    run.add_argument(
        "--master",
        default=None,
        help="Spark master, e.g. spark://host:7077 (default: spark-submit's --master under spark-submit, "
        "else local[*])",
    )
    run.add_argument(
        "--trigger",
        default="availableNow",
        help="availableNow (default) or processingTime:<interval>, e.g. processingTime:5s",
    )
    run.add_argument("--max-offsets-per-trigger", type=int, default=5000, help="admission control (0: none)")
    run.add_argument(
        "--shuffle-partitions", type=positive_int, default=4, help="Spark partitions of the state/sink"
    )
    run.add_argument("--delivery", choices=("exactly_once", "at_least_once"), default="exactly_once")
    run.add_argument("--transactional-id-prefix", default="orders-pipeline")
    run.add_argument("--timeout", type=float, default=None, help="stop after this many seconds")
    run.add_argument("--until-caught-up", action="store_true", help="processingTime: stop once caught up")
    run.add_argument(
        "--jvm",
        choices=("quick", "full"),
        default=None,
        help="driver JVM flags: quick (C1 JIT only, serial GC: faster start-up, slower steady state; "
        "the default on a local master) or full (the JVM's defaults; the default on a cluster)",
    )
    run.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE")
    run.add_argument("--sink-option", action="append", default=[], metavar="KEY=VALUE")
    _quiet(run)
    run.set_defaults(func=_run)

    demo = strict(
        sub.add_parser(
            "demo", help="brokers of its own (one, or --cluster N), sample orders, the job, verify"
        )
    )
    pipeline_demo.add_arguments(demo)
    demo.set_defaults(func=pipeline_demo.main)

    ver = strict(sub.add_parser("verify", help="check the outputs against the committed input"))
    _common(ver)
    ver.add_argument("--json", action="store_true", help="print the report as JSON")
    ver.add_argument("--table", action="store_true", help="print the category table too")
    ver.set_defaults(func=_verify)


def _common(parser: argparse.ArgumentParser) -> None:
    add_connection_options(parser)
    parser.add_argument("--topic-prefix", default="", help="prefix for the three topic names")


def _quiet(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")


def spark_kafka_options(client: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """The client settings of ``--command-config``/``-X`` as the Spark source's and sink's ``kafka.*``
    options (which hand them to librdkafka)."""
    return tuple((f"kafka.{key}", str(value)) for key, value in sorted(client.items()))


def spark_master(requested: str | None) -> str:
    """``--master``, else the master spark-submit was given (its JVM, which PySpark joins through
    ``PYSPARK_GATEWAY_PORT``, holds it as ``spark.master``), else ``local[*]``. The session builder
    must be told: a master set on the builder overrides spark-submit's."""
    if requested:
        return requested
    if os.environ.get("PYSPARK_GATEWAY_PORT"):
        from pyspark import SparkConf, SparkContext

        SparkContext._ensure_initialized()  # joins spark-submit's JVM: SparkConf reads it from there
        submitted = SparkConf().get("spark.master")
        if submitted:
            return str(submitted)
    return "local[*]"


def _pairs(items: list[str]) -> list[tuple[str, str]]:
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"expected KEY=VALUE, got {item!r}")
        out.append((key, value))
    return out


@guarded("exactly pipeline generate")
def _generate(args: argparse.Namespace) -> int:
    from exactly.spark.orders import Topics, create_topics, generate

    topics = Topics.with_prefix(args.topic_prefix)
    client = security_config(args)
    create_topics(args.bootstrap_server, topics, partitions=args.partitions, client=client)
    with progress(f"generate {topics.orders}", args.orders, unit="orders", quiet=args.quiet) as tracker:
        result = generate(
            args.bootstrap_server,
            topics,
            args.orders,
            transactional=args.mode == "transactional",
            txn_size=args.txn_size,
            abort_every=args.abort_every,
            seed=args.seed,
            first_order_id=args.first_order_id,
            progress=lambda done: tracker.update(done.committed),
            client=client,
        )
    print(
        f"generated {result.committed} committed orders ({result.aborted} more in "
        f"{result.aborted_transactions} aborted transactions) to {topics.orders} in {result.seconds:.1f}s"
    )
    return 0


@guarded("exactly pipeline run")
def _run(args: argparse.Namespace) -> int:
    from exactly.spark.orders import Topics, create_topics
    from exactly.spark.pipeline import JobConfig, run
    from exactly.spark.session import build_session

    topics = Topics.with_prefix(args.topic_prefix)
    client = security_config(args)
    create_topics(args.bootstrap_server, topics, client=client)
    conf = {"spark.sql.shuffle.partitions": str(args.shuffle_partitions), **dict(_pairs(args.spark_conf))}
    master = spark_master(args.master)
    quick_jvm = None if args.jvm is None else args.jvm == "quick"
    spark = build_session(master, "exactly-orders-pipeline", conf, quick_jvm=quick_jvm)
    print(f"spark {spark.version} master {master}; pid {os.getpid()}", flush=True)

    def stop(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    config = JobConfig(
        bootstrap=args.bootstrap_server,
        checkpoint=args.checkpoint,
        topics=topics,
        trigger=args.trigger,
        max_offsets_per_trigger=args.max_offsets_per_trigger or None,
        delivery=args.delivery,
        transactional_id_prefix=args.transactional_id_prefix,
        extra_sink_options=tuple(_pairs(args.sink_option)),
        kafka_options=spark_kafka_options(client),
    )
    try:
        # the input's size is unknown to a stream (and a resumed checkpoint skips part of it):
        # count and rate, no ETA
        with progress("pipeline run", unit="orders", quiet=args.quiet) as tracker:
            summary = run(
                spark,
                config,
                timeout=args.timeout,
                until_caught_up=args.until_caught_up,
                on_progress=lambda line: print(line, flush=True),
                on_rows=tracker.update,
            )
    except KeyboardInterrupt:
        print("stopped", flush=True)
        return 130
    finally:
        spark.stop()
    rate = summary["orders"] / summary["seconds"] if summary["seconds"] else 0.0
    print(
        f"pipeline {'finished' if summary['finished'] else 'stopped'}: {summary['orders']} orders in "
        f"{summary['batches']} batches, {summary['seconds']:.1f}s ({rate:.0f} orders/s)",
        flush=True,
    )
    if args.until_caught_up and not summary["finished"]:
        return 2  # asked to catch up and did not (timeout)
    return 0


@guarded("exactly pipeline verify")
def _verify(args: argparse.Namespace) -> int:
    from exactly.spark.orders import Topics, category_table, verify

    report = verify(
        args.bootstrap_server, Topics.with_prefix(args.topic_prefix), client=security_config(args)
    )
    if args.json:
        print(
            json.dumps(
                {
                    "ok": report.ok,
                    "orders": report.orders,
                    "updates": report.updates,
                    "batches": report.batches,
                    "problems": report.problems,
                    "latest": report.latest,
                }
            )
        )
    else:
        if args.table:
            print(category_table(report))
        print(f"verification: {report.summary()}")
    sys.stdout.flush()
    return 0 if report.ok else 1
