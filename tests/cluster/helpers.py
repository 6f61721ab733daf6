"""Helpers of the ZooKeeper-backed cluster tests."""

from __future__ import annotations

import time
from collections.abc import Callable

from kazoo.client import KazooClient

from exactly.cluster.zk import ClusterZk

TEST_SESSION_TIMEOUT_MS = 2_000


def wait_for(condition: Callable[[], bool], timeout: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


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
