"""`make run`: the embedded broker and the orders pipeline on Spark, end to end, exactly once.

1. starts ``exactly serve`` as a subprocess on a free loopback port with a temporary data dir;
2. writes sample order-completed events with a transactional producer - every 5th transaction is
   flushed to the broker and then aborted, so the log holds orders that must never be counted;
3. runs the Structured Streaming job (``exactly.spark.pipeline``) on Spark ``local[*]`` with
   ``trigger(availableNow=True)``: exactly source (read_committed) -> running totals per category
   and overall -> exactly-once sink into category-sales and total-sales, with a checkpoint,
   printing each micro-batch as it completes;
4. prints the category table read back from category-sales / total-sales (read_committed) and the
   verification result (``exactly pipeline verify``'s checks), then stops Spark and the broker.

Exit code 0 only if the verification passes.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from exactly.testing.broker import Broker

CATEGORIES_NOTE = "sales per category (read_committed from category-sales / total-sales)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--orders", type=int, default=20_000)
    parser.add_argument("--max-offsets-per-trigger", type=int, default=6_000)
    parser.add_argument("--master", default="local[*]")
    args = parser.parse_args(argv)

    from exactly.spark.orders import Topics, category_table, create_topics, generate, verify
    from exactly.spark.pipeline import JobConfig, run
    from exactly.spark.session import build_session

    with tempfile.TemporaryDirectory(prefix="exactly-demo-") as tmp:
        root = Path(tmp)
        broker = Broker(root / "data", root / "broker.log", name="demo-broker").start()
        bootstrap = broker.bootstrap
        spark = None
        try:
            print(f"broker listening on {bootstrap} (data dir {root / 'data'})", flush=True)
            topics = Topics()
            create_topics(bootstrap, topics, partitions=3)
            made = generate(bootstrap, topics, args.orders, transactional=True, txn_size=200, abort_every=5)
            print(
                f"generated {made.committed} committed orders in {made.transactions - made.aborted_transactions} "
                f"transactions, plus {made.aborted} orders in {made.aborted_transactions} aborted ones "
                f"({made.seconds:.1f}s)",
                flush=True,
            )
            print(f"starting Spark ({args.master}) ...", flush=True)
            started = time.monotonic()
            spark = build_session(
                args.master, "exactly-demo", {"spark.sql.shuffle.partitions": "4"}, log_level="ERROR"
            )
            print(
                f"Spark {spark.version} up in {time.monotonic() - started:.1f}s; running the pipeline",
                flush=True,
            )
            config = JobConfig(
                bootstrap=bootstrap,
                checkpoint=str(root / "checkpoint"),
                topics=topics,
                trigger="availableNow",
                max_offsets_per_trigger=args.max_offsets_per_trigger,
            )
            summary = run(spark, config, on_progress=lambda line: print(f"  {line}", flush=True))
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
        finally:
            if spark is not None:
                spark.stop()
            broker.close()


if __name__ == "__main__":
    sys.exit(main())
