"""Fixtures for the PySpark connector tests: ONE local SparkSession for the whole test session.

Spark takes 10-20 s to start, so it is started once (``spark``) and shared by every test in
tests/spark; tests use unique topic names and checkpoint dirs so they never see each other's data.
The crash tests (test_crash.py) do not use it: they run the pipeline as subprocesses so they can
SIGKILL the driver JVM.

Settings: ``local[2,4]`` (2 threads, a failed task is retried up to 4 times, so the retry tests
work), UI off, 2 shuffle partitions, loopback only, and ``src`` on the workers' PYTHONPATH.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.broker import Broker

MASTER = "local[2,4]"


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    if shutil.which("java") is None:
        pytest.skip("java is not installed (make system-deps)")
    from exactly.spark.session import build_session

    session = build_session(
        MASTER,
        "exactly-tests",
        {"spark.sql.shuffle.partitions": "2", "spark.sql.streaming.noDataMicroBatches.enabled": "false"},
        log_level="ERROR",
    )
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def bootstrap(broker: Broker) -> str:
    return broker.bootstrap
