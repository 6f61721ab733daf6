"""One ZooKeeper per test run, also when pytest-xdist spreads the tests over several workers.

Without xdist the cluster tests' session fixture starts ZooKeeper on first use (tests/cluster/
conftest.py). With xdist every worker is a session of its own, so that fixture alone would start
one ZooKeeper per worker; instead the controller process (the one that hands out tests) starts a
single server before the workers start, gives them its address in ``workerinput``, and stops it at
the end. Tests never see each other's znodes either way: each one gets its own chroot.

A test that stops or pauses ZooKeeper itself must not do it to the shared server (the other
worker's clusters would lose it): it asks for the ``own_zookeeper`` fixture instead.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from exactly.cluster.zookeeper import JAVA_DIR, ZooKeeperServer

WORKERINPUT_KEY = "exactly_zookeeper"

_server: ZooKeeperServer | None = None
_data_dir: Path | None = None


def is_xdist_controller(config: pytest.Config) -> bool:
    """True in the process that distributes tests to xdist workers (not in a worker, not without xdist)."""
    numprocesses = getattr(config.option, "numprocesses", None)
    return not hasattr(config, "workerinput") and bool(numprocesses)


def available() -> bool:
    return shutil.which("java") is not None and (JAVA_DIR / "zookeeper.jar").exists()


def start_for_workers() -> str | None:
    """Start the run's ZooKeeper in the controller; its ``host:port``, or None when ZooKeeper or java
    is missing (the cluster tests then skip in the workers, as they do without xdist)."""
    global _server, _data_dir
    if not available():
        return None
    if _server is None:
        _data_dir = Path(tempfile.mkdtemp(prefix="exactly-tests-zookeeper-"))
        server = ZooKeeperServer(_data_dir, port=0)
        server.start()
        _server = server
    return _server.address.connect


def stop_for_workers() -> None:
    global _server, _data_dir
    server, _server = _server, None
    if server is not None:
        server.stop()
    if _data_dir is not None:
        shutil.rmtree(_data_dir, ignore_errors=True)
        _data_dir = None


def address_from_controller(config: pytest.Config) -> str | None:
    """In an xdist worker: the controller's ZooKeeper (``host:port``), if it started one."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return None
    address = workerinput.get(WORKERINPUT_KEY)
    return str(address) if address else None
