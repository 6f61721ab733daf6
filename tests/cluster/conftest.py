"""One real ZooKeeper for the whole test session; every test gets its own chroot.

Starting ZooKeeper costs a JVM start (about 1.5-2 s), so it happens once per test run: on first use
when the tests run in one process, in the controller when pytest-xdist runs several workers
(tests/support/shared_zookeeper.py). A test that stops or pauses ZooKeeper asks for ``own_zookeeper``.
Tests never see each other's znodes: ``zk_connect`` is ``127.0.0.1:<port>/t-<uuid>``, and
``ClusterZk`` creates the chroot on start, as Kafka does.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from exactly.cluster.zk import ClusterZk
from exactly.cluster.zookeeper import JAVA_DIR, ZooKeeperAddress, ZooKeeperServer
from tests.cluster.helpers import TEST_SESSION_TIMEOUT_MS
from tests.support.shared_zookeeper import address_from_controller


@pytest.fixture(scope="session")
def zookeeper(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ZooKeeperAddress]:
    """The run's shared ZooKeeper: the xdist controller's (tests/support/shared_zookeeper.py), or one
    started here on first use when the tests run in one process. Tests must not stop or pause it."""
    shared = address_from_controller(request.config)
    if shared is not None:
        host, port = shared.rsplit(":", 1)
        yield ZooKeeperAddress(host, int(port))
        return
    with _started(tmp_path_factory.mktemp("zookeeper")) as server:
        yield server.address


@pytest.fixture
def own_zookeeper(tmp_path: Path) -> Iterator[ZooKeeperServer]:
    """A private ZooKeeper for a test that stops or pauses ZooKeeper itself; a test asking for it gets
    its cluster (``zk_connect``) on this server instead of the shared one."""
    with _started(tmp_path / "own-zookeeper") as server:
        yield server


@contextmanager
def _started(data_dir: Path) -> Iterator[ZooKeeperServer]:
    if shutil.which("java") is None or not (JAVA_DIR / "zookeeper.jar").exists():
        pytest.skip("ZooKeeper (Debian's zookeeper package) or java is not installed: run make setup")
    server = ZooKeeperServer(data_dir, port=0)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def zk_connect(request: pytest.FixtureRequest) -> str:
    if "own_zookeeper" in request.fixturenames:
        address = request.getfixturevalue("own_zookeeper").address
    else:
        address = request.getfixturevalue("zookeeper")
    return f"{address.connect}/t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def cluster_zk(zk_connect: str) -> Iterator[Callable[[], ClusterZk]]:
    """A factory of started ``ClusterZk`` sessions on the test's chroot; all stopped afterwards."""
    opened: list[ClusterZk] = []

    def open_session() -> ClusterZk:
        zk = ClusterZk(zk_connect, session_timeout_ms=TEST_SESSION_TIMEOUT_MS)
        zk.start()
        opened.append(zk)
        return zk

    yield open_session
    for zk in opened:
        try:
            zk.stop()
        except Exception:
            pass


@pytest.fixture
def zk(cluster_zk: Callable[[], ClusterZk]) -> ClusterZk:
    """The test's own ZooKeeper session on the cluster's chroot, to read the authoritative state."""
    return cluster_zk()
