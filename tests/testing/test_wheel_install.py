"""A wheel built from this repository, installed into a fresh venv, gives a test project its
``exactly_broker`` fixture with nothing else: ``pip install <wheel> pytest`` and one test file.

The source is copied first (``src``, ``pyproject.toml``, ``README.md``) so that the build neither
writes into the checkout nor picks up a stale ``build/`` directory. The project runs with no
PYTHONPATH, so the package, the plugin (through its ``pytest11`` entry point) and the broker the
fixture starts all come from the venv. Needs PyPI (or pip's cache) for the dependencies; slow
(about a minute, most of it installing pyspark and pyarrow).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PROJECT_TEST = textwrap.dedent(
    """
    import exactly
    from confluent_kafka import Consumer, Producer, TopicPartition


    def test_the_plugin_comes_from_the_entry_point(request):
        distributions = [dist.project_name for _, dist in request.config.pluginmanager.list_plugin_distinfo()]
        assert "exactly" in distributions


    def test_transaction_is_read_committed(exactly_broker):
        assert "site-packages" in exactly.__file__  # the installed wheel, not a source tree
        bootstrap = exactly_broker.bootstrap_servers
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "app"})
        producer.init_transactions(15)
        producer.begin_transaction()
        producer.produce("out", b"kept")
        producer.commit_transaction(15)
        producer.begin_transaction()
        producer.produce("out", b"dropped")
        producer.flush(15)
        producer.abort_transaction(15)

        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "g",
                             "isolation.level": "read_committed", "enable.partition.eof": True})
        consumer.assign([TopicPartition("out", 0, 0)])
        values = []
        while True:
            msg = consumer.poll(15)
            assert msg is not None, "no end of partition within 15 s"
            if msg.error():
                break
            values.append(msg.value())
        consumer.close()
        assert values == [b"kept"]
    """
)


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, (
        f"{' '.join(cmd)} failed:\n{result.stdout[-5000:]}\n{result.stderr[-5000:]}"
    )
    return result


@pytest.mark.slow
def test_wheel_installs_and_its_fixture_runs_a_users_test(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    source = tmp_path / "source"
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    venv = tmp_path / "venv"
    try:
        run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                str(source),
                "--no-deps",
                "-q",
                "-w",
                str(tmp_path / "dist"),
            ],
            tmp_path,
            env,
            300,
        )
        [wheel] = (tmp_path / "dist").glob("exactly-*.whl")
        run([sys.executable, "-m", "venv", str(venv)], tmp_path, env, 120)
        run([str(venv / "bin" / "pip"), "install", "-q", str(wheel), "pytest"], tmp_path, env, 600)
        project = tmp_path / "project"
        project.mkdir()
        (project / "test_app.py").write_text(PROJECT_TEST)
        pytest_cmd = [str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        result = run(pytest_cmd, project, env, 300)
        assert "2 passed" in result.stdout, result.stdout
        # naming the module as well (a conftest's pytest_plugins, -p) does not register it twice
        result = run([*pytest_cmd, "-p", "exactly.testing.pytest_plugin"], project, env, 300)
        assert "2 passed" in result.stdout, result.stdout
    finally:
        shutil.rmtree(venv, ignore_errors=True)  # ~900 MB
