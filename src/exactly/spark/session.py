"""Building a SparkSession that can run the ``exactly`` data source.

Python data sources run in Spark's Python workers, which must import ``exactly``: on ``local[*]``
the workers inherit this process's environment (we put ``src`` on ``PYTHONPATH`` and make the
workers use this interpreter); on a cluster the package is zipped and shipped with
``addPyFile`` (the workers still need pyspark, pyarrow, pandas and confluent-kafka installed).
"""

from __future__ import annotations

import os
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # .../src/exactly
SRC_DIR = PACKAGE_DIR.parent

FAST_LOCAL_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.streaming.stopGracefullyOnShutdown": "false",
    "spark.python.worker.reuse": "true",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.driver.memory": "1g",
    "spark.ui.showConsoleProgress": "false",
    # local masters only: the Python workers' daemon with the connector's imports done before the
    # fork (see exactly.spark.daemon); "pyspark.daemon" is Spark's own
    "spark.python.daemon.module": "exactly.spark.daemon",
}

# JVM flags of a local driver (``quick_jvm``): such a driver lives for one run of a job - a
# test's, ``make run``'s, a short catch-up - and most of its CPU before the first micro-batch is
# class loading and JIT compilation. C2 compiles Spark's start-up paths at a high CPU price
# that a short run never earns back; C1 alone (TieredStopAtLevel=1) compiles them for a
# fraction of it, and the serial collector starts no GC worker threads to compete for the same
# cores. On the 2-core test box: about 40% less JVM CPU from the launch to a first job
# (bench/results/spark-start.md). The price is slower steady-state code: a long-running local
# job with large micro-batches may want ``quick_jvm=False`` (``exactly pipeline run --jvm full``).
QUICK_START_JVM_OPTIONS: tuple[str, ...] = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")

_LOG4J = """\
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{HH:mm:ss}} %p %c{{1}}: %m%n%ex
logger.hadoop.name = org.apache.hadoop
logger.hadoop.level = error
logger.snappy.name = org.apache.spark.util.Utils
logger.snappy.level = error
"""


def log4j_file(level: str) -> Path:
    """A log4j2 configuration at ``level`` (replaces Spark's default profile and its banner)."""
    path = Path(tempfile.gettempdir()) / f"exactly-spark-log4j2-{level.lower()}.properties"
    text = _LOG4J.format(level=level.lower())
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return path


def prepare_environment() -> None:
    """Environment for the JVM and its Python workers; call before the first SparkSession."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = os.environ.get("PYSPARK_PYTHON", sys.executable)
    os.environ["PYSPARK_DRIVER_PYTHON"] = os.environ.get("PYSPARK_DRIVER_PYTHON", sys.executable)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(SRC_DIR) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(SRC_DIR), *paths])
    # keep Python workers from buffering log lines we may want to read after a crash
    os.environ.setdefault("PYTHONUNBUFFERED", "1")


def package_zip() -> Path:
    """``exactly`` as a zip for ``addPyFile`` (cluster masters)."""
    target = Path(tempfile.mkdtemp(prefix="exactly-pyfiles-")) / "exactly.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in PACKAGE_DIR.rglob("*.py"):
            zf.write(path, path.relative_to(SRC_DIR))
    return target


def build_session(
    master: str = "local[*]",
    app_name: str = "exactly",
    conf: Mapping[str, Any] | None = None,
    log_level: str = "WARN",
    quick_jvm: bool | None = None,
) -> Any:
    """A SparkSession with the ``exactly`` format registered.

    ``quick_jvm``: start the driver JVM with :data:`QUICK_START_JVM_OPTIONS` (default: on for a
    ``local`` master, whose driver is also the executor; off for a cluster's long-lived driver).
    A ``spark.driver.extraJavaOptions`` in ``conf`` replaces all of them."""
    prepare_environment()
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    settings = dict(FAST_LOCAL_CONF)
    if not master.startswith("local"):
        settings.pop("spark.driver.host")
        settings.pop("spark.driver.bindAddress")
        settings.pop("spark.python.daemon.module")
    java_opts = f"-Dlog4j.configurationFile=file:{log4j_file(log_level)}"
    if master.startswith("local") if quick_jvm is None else quick_jvm:
        settings["spark.driver.extraJavaOptions"] = " ".join((java_opts, *QUICK_START_JVM_OPTIONS))
    else:
        settings["spark.driver.extraJavaOptions"] = java_opts
    settings["spark.executor.extraJavaOptions"] = java_opts
    settings.update({k: str(v) for k, v in (conf or {}).items()})
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    if not master.startswith("local"):
        spark.sparkContext.addPyFile(str(package_zip()))
    register(spark)
    return spark


def register(spark: Any) -> None:
    from exactly.spark.datasource import ExactlyDataSource

    spark.dataSource.register(ExactlyDataSource)
