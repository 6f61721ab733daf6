"""PySpark connectors for Kafka-compatible brokers: the ``exactly`` format.

* ``datasource.py`` - the DataSource registered as ``format("exactly")``
* ``options.py`` - option parsing (names as Spark's Kafka connector)
* ``offsets.py`` - offsets per topic-partition, LSO queries, admission control
* ``source.py`` - streaming and batch readers
* ``sink.py`` + ``progress.py`` - exactly-once (and at-least-once) writer
* ``session.py`` - a SparkSession that can run all this
* ``orders.py`` / ``pipeline.py`` - the orders example (generate, run, verify)

Importing this package does not import pyspark; ``register(spark)`` does.
"""

from __future__ import annotations

from typing import Any

FORMAT = "exactly"


def register(spark: Any) -> None:
    """Register the ``exactly`` format on ``spark``."""
    from exactly.spark.session import register as _register

    _register(spark)


__all__ = ["FORMAT", "register"]
