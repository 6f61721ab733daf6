"""Helpers of the ZooKeeper-backed cluster tests."""

from __future__ import annotations

from collections.abc import Callable

from kazoo.client import KazooClient

from exactly.cluster.zk import ClusterZk
from exactly.testing.wait import wait_until

TEST_SESSION_TIMEOUT_MS = 2_000


def wait_for(condition: Callable[[], bool], timeout: float = 15.0, what: str = "condition") -> None:
    """``exactly.testing.wait.wait_until`` at a ZooKeeper pace (20 ms)."""
    wait_until(condition, timeout, what, interval=0.02)


def expire_session(zk: ClusterZk) -> None:
    """Expire ``zk``'s session from the server side, as a pause longer than the session timeout
    would: a second client joins the same session and closes it (the standard ZooKeeper trick)."""
    session_id, password = zk.client.client_id
    twin = KazooClient(
        hosts=zk.connect, client_id=(session_id, password), timeout=TEST_SESSION_TIMEOUT_MS / 1000
    )
    twin.start(10)
    twin.stop()
    twin.close()
