"""``exactly pipeline demo`` (and ``make run`` / ``make run-cluster``): the orders pipeline end to end.

1. starts the brokers: one embedded ``exactly serve`` (default), or with ``--cluster N`` a local
   replicated cluster (``LocalCluster``: ZooKeeper + N brokers, topics RF 3 with
   min.insync.replicas 2, internal topics replicated);
2. writes sample order-completed events with a transactional producer - every 5th transaction is
   flushed to the brokers and then aborted, so the log holds orders that must never be counted;
3. runs the Structured Streaming job (``exactly.spark.pipeline``) with ``trigger(availableNow)``,
   printing each micro-batch. With ``--kill-broker-after N`` (cluster only) a thread kills -9,
   once N micro-batches are written, the broker whose loss hurts the job most (``choose_victim``:
   the transaction coordinator / an output partition's leader) and restarts it on its old port
   once the others dropped it;
4. prints the category table and the verification (``exactly pipeline verify``'s checks).

Like the other sub-commands, the heavy modules (Spark, the cluster launcher, the wire client) are
imported by the functions that use them: ``exactly --help`` stays fast.

Exit status 0 only if the verification passes. If the query itself fails while a broker is down
(a task out of retries), it is restarted from its checkpoint, as one would restart a Spark job:
exactly-once across that restart is the sink's and the checkpoint's job (up to ``MAX_RUNS`` runs).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from exactly.cli.local_cluster import LocalCluster, Victim

CATEGORIES_NOTE = "sales per category (read_committed from category-sales / total-sales)"
MAX_RUNS = 3
# a killed broker's partitions move once ZooKeeper expires its session: 6 s, not Kafka's 18 s
CLUSTER_SESSION_TIMEOUT_MS = "6000"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--orders", type=int, default=20_000, help="committed orders to generate")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=None, help="orders per micro-batch")
    parser.add_argument(
        "--master", default=None, help="Spark master (default local[*]; local[*,4] on a cluster)"
    )
    parser.add_argument(
        "--cluster", type=int, default=0, metavar="N", help="run on ZooKeeper + N replicated brokers"
    )
    parser.add_argument(
        "--kill-broker-after",
        type=int,
        default=None,
        metavar="BATCHES",
        help="with --cluster: kill -9 a broker after this many micro-batches, restart it later",
    )
    parser.add_argument("--data-dir", type=Path, default=None, help="keep data and logs here (default: temp)")


def main(args: argparse.Namespace) -> int:
    from exactly.spark.orders import Topics, category_table, create_topics, generate, verify
    from exactly.spark.pipeline import JobConfig
    from exactly.spark.session import build_session

    if args.kill_broker_after is not None and args.cluster < 2:
        print("exactly pipeline demo: --kill-broker-after needs --cluster 2 or more", file=sys.stderr)
        return 2
    master = args.master or ("local[*,4]" if args.cluster else "local[*]")
    per_trigger = args.max_offsets_per_trigger or (2_000 if args.cluster else 6_000)
    with _data_dir(args.data_dir) as root, _brokers(root, args.cluster) as (bootstrap, cluster):
        topics = Topics()
        create_topics(bootstrap, topics, partitions=3)
        made = generate(bootstrap, topics, args.orders, transactional=True, txn_size=200, abort_every=5)
        print(
            f"generated {made.committed} committed orders in {made.transactions - made.aborted_transactions} "
            f"transactions, plus {made.aborted} orders in {made.aborted_transactions} aborted ones "
            f"({made.seconds:.1f}s)",
            flush=True,
        )
        print(f"starting Spark ({master}) ...", flush=True)
        started = time.monotonic()
        spark = build_session(
            master, "exactly-demo", {"spark.sql.shuffle.partitions": "4"}, log_level="ERROR"
        )
        try:
            print(
                f"Spark {spark.version} up in {time.monotonic() - started:.1f}s; running the pipeline",
                flush=True,
            )
            config = JobConfig(
                bootstrap=bootstrap,
                checkpoint=str(root / "checkpoint"),
                topics=topics,
                trigger="availableNow",
                max_offsets_per_trigger=per_trigger,
            )
            crash = None
            if cluster is not None and args.kill_broker_after is not None:
                crash = BrokerCrash(cluster, args.kill_broker_after, (topics.category, topics.total))
            summary = _run_to_the_end(spark, config, crash)
            if crash is not None:
                crash.finish()
        finally:
            spark.stop()
        rate = summary["orders"] / summary["seconds"] if summary["seconds"] else 0.0
        print(
            f"caught up: {summary['orders']} orders in {summary['batches']} micro-batches, "
            f"{summary['seconds']:.1f}s ({rate:.0f} orders/s, first batch includes worker start-up)\n",
            flush=True,
        )
        report = verify(bootstrap, topics)
        print(CATEGORIES_NOTE)
        print(category_table(report))
        print(f"\nverification: {report.summary()}", flush=True)
        return 0 if report.ok else 1


def _run_to_the_end(spark: Any, config: Any, crash: BrokerCrash | None) -> dict[str, Any]:
    """Run the job until it caught up; restart a failed query from its checkpoint."""
    from pyspark.errors import StreamingQueryException

    from exactly.spark.pipeline import run

    total = {"batches": 0, "orders": 0, "seconds": 0.0, "finished": False}
    for attempt in range(1, MAX_RUNS + 1):

        def progress(line: str) -> None:
            print(f"  {line}", flush=True)
            if crash is not None:
                crash.batch_written()

        try:
            summary = run(spark, config, on_progress=progress)
        except (RuntimeError, StreamingQueryException) as exc:
            if attempt == MAX_RUNS:
                raise
            print(f"  the query failed ({str(exc).splitlines()[0][:200]}); restarting it from its checkpoint")
            continue
        for key in ("batches", "orders", "seconds"):
            total[key] += summary[key]
        total["finished"] = summary["finished"]
        if summary["finished"]:
            break
    return total


class BrokerCrash:
    """kill -9 of one broker after ``after`` micro-batches, and its restart, in a thread (the job
    keeps the main thread: the SparkSession's Python data sources are registered for it)."""

    def __init__(self, cluster: LocalCluster, after: int, outputs: tuple[str, ...]) -> None:
        self.cluster, self.after, self.outputs = cluster, after, outputs
        self.batches = 0
        self.thread: threading.Thread | None = None
        self.victim: Victim | None = None
        self.failure: BaseException | None = None

    def batch_written(self) -> None:
        self.batches += 1
        if self.batches == self.after and self.thread is None:
            self.thread = threading.Thread(target=self._crash, name="broker-crash", daemon=True)
            self.thread.start()

    def _crash(self) -> None:
        from exactly.cli.local_cluster import choose_victim, restart_after_deregistration
        from exactly.client.cluster_status import read_status

        try:
            self.victim = choose_victim(read_status(self.cluster.bootstrap, timeout_s=5), self.outputs)
            print(f"  >>> kill -9 {self.victim.describe()}", flush=True)
            self.cluster.broker(self.victim.broker_id).kill()
            restart_after_deregistration(self.cluster, self.victim.broker_id)
            print(f"  >>> broker {self.victim.broker_id} restarted", flush=True)
        except BaseException as exc:
            self.failure = exc
            print(f"  >>> the broker crash failed: {exc}", flush=True)

    def finish(self) -> None:
        """Wait for the restart (the verification reads from every partition's leader)."""
        if self.thread is None:
            print(f"  >>> the job wrote only {self.batches} micro-batches: no broker was killed")
            return
        self.thread.join()


@contextmanager
def _data_dir(path: Path | None) -> Iterator[Path]:
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
        yield path.resolve()
        return
    with tempfile.TemporaryDirectory(prefix="exactly-demo-") as tmp:
        yield Path(tmp)


@contextmanager
def _brokers(root: Path, count: int) -> Iterator[tuple[str, LocalCluster | None]]:
    from exactly.cli.local_cluster import LocalCluster, replicated_defaults
    from exactly.testing.broker import Broker

    if not count:
        broker = Broker(root / "data", root / "broker.log", name="demo-broker").start()
        try:
            print(f"broker listening on {broker.bootstrap} (data dir {root / 'data'})", flush=True)
            yield broker.bootstrap, None
        finally:
            broker.close()
        return
    overrides = {**replicated_defaults(count), "zookeeper.session.timeout.ms": CLUSTER_SESSION_TIMEOUT_MS}
    cluster = LocalCluster(root / "cluster", count, overrides)
    try:
        cluster.start()
        print(
            f"zookeeper {cluster.connect}; {count} brokers on {cluster.bootstrap} "
            f"(logs {root / 'cluster'}/broker-<id>.log)",
            flush=True,
        )
        yield cluster.bootstrap, cluster
    finally:
        cluster.close()
