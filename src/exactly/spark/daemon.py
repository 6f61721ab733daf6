"""Spark's Python worker daemon, with the connector's thread-free imports done once before it forks.

Spark starts one ``pyspark.daemon`` per kind of Python worker and forks a worker from it for every
task that needs one; the worker then imports what it runs - Spark's worker code, the data source
(``exactly.spark.datasource``: confluent-kafka, the wire client and its kio schemas) - about 2-5 s
of CPU per fork on the 2-core test box, paid again by every new worker of a pipeline's first
micro-batch. This module imports the part of that which starts no thread, then runs Spark's own
daemon loop: the forked workers find those modules imported.

Why not everything: ``pyspark.daemon`` imports worker code after the fork on purpose - pyarrow
and pandas start threads when imported (jemalloc's background thread, among others), and a fork
copies only the forking thread, leaving any lock another thread held locked for good. So pyarrow,
pandas and every module that imports them at module level stay out of :data:`PRELOAD`, and the
daemon checks (``/proc/self/task``) that it still has one thread after the imports; if not (a
newer library started one), it replaces itself with the stock ``pyspark.daemon`` (same pid and
pipes, nothing preloaded) before it forks anything.

Used on a ``local`` master (``spark.python.daemon.module``, see ``exactly.spark.session``): its
workers run this interpreter with ``src`` on the path. On a cluster the executors' daemon starts
before ``addPyFile`` ships the package, so the stock daemon stays.
"""

from __future__ import annotations

import importlib
import os
import sys

from pyspark import daemon as spark_daemon

# thread-free on import (tests/spark/test_daemon.py checks it); none imports pyarrow or pandas
PRELOAD = (
    "pyspark.worker",
    "pyspark.sql.datasource",
    "pyspark.sql.worker.create_data_source",
    "pyspark.sql.worker.write_into_data_source",
    "pyspark.sql.worker.commit_data_source_write",
    "confluent_kafka",
    "exactly.client.broker_pool",
    "exactly.client.two_phase",
    "exactly.client.txn_admin",
    "exactly.spark.clients",
    "exactly.spark.options",
    "exactly.spark.offsets",
    "exactly.spark.orders",
    "exactly.spark.retries",
    "exactly.spark.timings",
    "exactly.spark.pipeline",
)

STOCK_DAEMON = "pyspark.daemon"


def threads() -> int | None:
    """This process's threads (native ones too), or None where /proc does not tell."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


def preload() -> bool:
    """Import :data:`PRELOAD`; True if the process is still single-threaded (safe to fork)."""
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional part missing: the worker reports it if it needs it
            continue
    return threads() == 1


def main() -> None:
    if not preload():
        os.execv(sys.executable, [sys.executable, "-m", STOCK_DAEMON, *sys.argv[1:]])
    spark_daemon.manager()


if __name__ == "__main__":
    main()
