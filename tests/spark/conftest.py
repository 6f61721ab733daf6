"""Fixtures for the PySpark connector tests. The session's one SparkSession (``spark``) lives in
tests/conftest.py, shared with the cluster tests. The crash tests (test_crash.py,
test_two_phase_crash.py) do not use it: they run the pipeline as subprocesses
(pipeline_process.py) so they can SIGKILL the driver JVM.
"""

from __future__ import annotations

import pytest

from tests.support.broker import Broker


@pytest.fixture
def bootstrap(broker: Broker) -> str:
    return broker.bootstrap
