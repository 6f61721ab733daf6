"""One real ZooKeeper for the whole test session; every test gets its own chroot.

Starting ZooKeeper costs a JVM start (about 1.5-2 s), so it happens once per session, on first use.
Tests never see each other's znodes: ``zk_connect`` is ``127.0.0.1:<port>/t-<uuid>``, and
``ClusterZk`` creates the chroot on start, as Kafka does.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable, Iterator

import pytest

from exactly.cluster.zk import ClusterZk
from exactly.cluster.zookeeper import JAVA_DIR, ZooKeeperServer
from tests.cluster.helpers import TEST_SESSION_TIMEOUT_MS


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    if shutil.which("java") is None or not (JAVA_DIR / "zookeeper.jar").exists():
        pytest.skip("ZooKeeper (Debian's zookeeper package) or java is not installed: run make setup")
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"), port=0)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def zk_connect(zookeeper: ZooKeeperServer) -> str:
    return f"{zookeeper.address.connect}/t-{uuid.uuid4().hex[:12]}"


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
