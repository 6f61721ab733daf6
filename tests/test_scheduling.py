"""``make test``'s scheduling (tests/support/scheduling.py) on a small suite run the way ``make test``
runs the real one (``pytest -n 2 --dist loadgroup``), in a subprocess: every test that uses the
``spark`` fixture runs on one worker, and the ``slow`` tests (longest declared timeout first) are
handed out before the short ones. The grouping is what pytest 9.2 with pytest-xdist 3.8 silently
stopped doing, so this is the test that fails if an upgrade breaks it again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CONFTEST = """
import json, os, time
import pytest

pytest_plugins = ["tests.support.scheduling"]

@pytest.fixture(scope="session")
def spark():
    return "session"

@pytest.fixture(autouse=True)
def record(request):
    started = time.monotonic_ns()
    yield
    with open("ran.jsonl", "a") as out:
        out.write(json.dumps({"name": request.node.name, "worker": os.environ.get("PYTEST_XDIST_WORKER"),
                              "nodeid": request.node.nodeid, "started": started}) + "\\n")
"""

TESTS = """
import pytest

def test_short_1(): pass
def test_short_2(): pass
def test_short_3(): pass
def test_short_4(): pass
def test_short_5(): pass
def test_short_6(): pass

@pytest.mark.slow
@pytest.mark.timeout(100)
def test_slow_100(): pass

@pytest.mark.slow
@pytest.mark.timeout(600)
def test_slow_600(): pass

def test_spark_1(spark): pass
def test_spark_2(spark): pass

@pytest.mark.parametrize("value", ["a@b", "c"])
def test_spark_param(spark, value): pass
"""


def run_suite(tmp_path: Path, *args: str) -> list[dict[str, object]]:
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (tmp_path / "test_suite.py").write_text(textwrap.dedent(TESTS))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads(line) for line in (tmp_path / "ran.jsonl").read_text().splitlines()]


@pytest.mark.timeout(180)
def test_loadgroup_keeps_the_spark_tests_on_one_worker_and_hands_out_slow_tests_first(tmp_path: Path) -> None:
    ran = run_suite(tmp_path, "-n", "2", "--dist", "loadgroup")
    assert len(ran) == 12
    spark = [r for r in ran if str(r["name"]).startswith("test_spark")]
    assert len({r["worker"] for r in spark}) == 1, spark
    assert all(str(r["nodeid"]).endswith("@spark") for r in spark), spark
    # the Spark group is the first unit of one worker; the other worker starts with the slow tests
    other_worker = [r for r in ran if r["worker"] != spark[0]["worker"]]
    other_worker.sort(key=lambda r: int(str(r["started"])))
    assert [r["name"] for r in other_worker[:2]] == ["test_slow_600", "test_slow_100"], other_worker


def test_without_xdist_the_file_order_stays(tmp_path: Path) -> None:
    ran = run_suite(tmp_path, "-p", "no:xdist")
    names = [r["name"] for r in ran]
    assert names[:7] == [f"test_short_{i}" for i in range(1, 7)] + ["test_slow_100"], names
    assert not [r for r in ran if str(r["nodeid"]).endswith("@spark")], ran
