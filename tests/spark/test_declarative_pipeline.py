"""The orders pipeline as a Spark Declarative Pipelines project (examples/orders-sdp), run by the
installed PySpark's ``spark-pipelines run`` against a broker that allows two-phase commit, with
``atomicBatches=true``; ``verify`` then checks the outputs.

SDP runs the definitions through Spark Connect: the ``exactly`` source and sink are Python data
sources registered on the Connect session, the sink is ``create_sink(format="exactly")``, and the
Connect server's Python workers import ``exactly`` from PYTHONPATH. The test copies the project and
sets the broker, topic prefix and sink options in the copy's ``configuration`` (where a user sets
them), and its ``storage`` to the test's directory. ``spark-pipelines`` starts its own Spark Connect
server, so the test is not in the Spark xdist group of the session's in-process SparkSession.

PySpark 4.3.0's Connect client ends ``spark-pipelines run`` with an error *after* the run completed:
the server sends the (empty) accumulator updates of the Python data source's workers as observed
metrics on the pipeline's event stream, and the client's ``execute_command_as_iterator`` rejects
any response that is not a dict (``[UNKNOWN_RESPONSE] Unknown response: Plan observed(
__python_accumulator__=...)``; fixed upstream in a later Spark). The test accepts exactly that
failure, and only after the run reported ``Run is COMPLETED``; the outputs are checked either way.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from exactly.spark.orders import Topics, create_topics, generate, verify
from tests.conftest import BrokerFactory
from tests.support.broker import SRC_DIR, child_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PROJECT = SRC_DIR.parent / "examples" / "orders-sdp"
COMPLETED = "Run is COMPLETED."


def spark_pipelines() -> Path:
    pyspark = pytest.importorskip("pyspark")
    for module in ("yaml", "grpc", "google.rpc", "zstandard"):  # pyspark[pipelines]
        pytest.importorskip(module)
    if shutil.which("java") is None:
        pytest.skip("java is not installed (make system-deps)")
    return Path(pyspark.__file__).resolve().parent / "bin" / "spark-pipelines"


def known_client_failure(output: str) -> bool:
    """PySpark 4.3.0's rejection of observed metrics on the event stream, after a completed run."""
    import pyspark

    return (
        pyspark.__version__ == "4.3.0"
        and COMPLETED in output
        and "[UNKNOWN_RESPONSE] Unknown response: Plan observed(__python_accumulator__" in output
    )


def run_project(launcher: Path, project: Path, log: Path) -> str:
    command = [str(launcher), "run", "--spec", str(project / "spark-pipeline.yml")]
    env = child_env(extra={"PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"})
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=800, cwd=project)
    output = f"{proc.stdout}\n{proc.stderr}"
    log.write_text(output)
    assert proc.returncode == 0 or known_client_failure(output), (
        f"spark-pipelines run -> {proc.returncode} (all output in {log}):\n{output[:3000]}\n...\n{output[-5000:]}"
    )
    assert COMPLETED in output, output[-8000:]
    assert "Flow order_updates has COMPLETED" in output, output[-8000:]
    return output


def copy_project(tmp_path: Path, **configuration: str) -> Path:
    """examples/orders-sdp under ``tmp_path``, its spec's storage and ``configuration`` replaced."""
    import yaml

    project = tmp_path / "orders-sdp"
    shutil.copytree(PROJECT, project, ignore=shutil.ignore_patterns("__pycache__"))
    spec_path = project / "spark-pipeline.yml"
    spec = yaml.safe_load(spec_path.read_text())
    spec["storage"] = (tmp_path / "storage").as_uri()
    spec["configuration"].update(configuration)
    spec_path.write_text(yaml.safe_dump(spec))
    return project


def test_orders_pipeline_as_a_declarative_pipeline(fresh_broker: BrokerFactory, tmp_path: Path) -> None:
    launcher = spark_pipelines()  # skips without pyspark[pipelines]'s extras or java
    broker = fresh_broker(**{"transaction.two.phase.commit.enable": "true"})
    prefix = f"sdp-{random.randrange(16**6):06x}-"
    project = copy_project(
        tmp_path,
        **{
            "spark.exactly.bootstrap.servers": broker.bootstrap,
            "spark.exactly.topic.prefix": prefix,
            "spark.exactly.transactional.id.prefix": f"sdp-{prefix}",
            "spark.exactly.sink.atomicBatches": "true",
            "spark.exactly.kafka.socket.timeout.ms": "30000",
        },
    )
    topics = Topics.with_prefix(prefix)
    create_topics(broker.bootstrap, topics, partitions=3)
    first = generate(broker.bootstrap, topics, 1000, txn_size=100, abort_every=4, seed=3)
    assert first.aborted > 0

    output = run_project(launcher, project, tmp_path / "run-1.log")
    assert f"on {broker.bootstrap}" in output  # the definitions read the spec's configuration
    report = verify(broker.bootstrap, topics)
    assert report.ok, report.summary()
    assert report.orders == 1000
