"""``exactly pipeline run --master``: which master the session gets (the spark-submit case, where
the master comes from spark-submit's JVM, was run by hand against the standalone cluster; see the
README)."""

from __future__ import annotations

import pytest

from exactly.cli.pipeline import spark_master


def test_an_explicit_master_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "1")  # never consulted when --master is given
    assert spark_master("spark://127.0.0.1:7077") == "spark://127.0.0.1:7077"


def test_without_spark_submit_the_default_is_local(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    assert spark_master(None) == "local[*]"
