"""``zk_base.ensure_path``: start-up path creation survives a dropped ZooKeeper connection.

A restarting broker once exited with code 1 before listening because one ``ensure_path`` met a
ConnectionLoss at load ~18 (``bench/results/txnbounce-s19.md``). The client here is a stand-in
for kazoo's only to make the connection drop on demand: what is tested is the retry policy
(which errors are retried, that the deadline still ends a ZooKeeper that never comes back)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from kazoo.exceptions import ConnectionLoss, NoAuthError, OperationTimeoutError, SessionExpiredError
from kazoo.retry import RetryFailedError

from exactly.cluster.zk_base import ensure_path


class _Flaky:
    """``ensure_path`` raises each error of ``errors`` in turn, then succeeds."""

    def __init__(self, errors: list[Exception]) -> None:
        self.errors = list(errors)
        self.created: list[str] = []
        self.slept: list[float] = []
        self.handler = SimpleNamespace(sleep_func=self.slept.append)

    def ensure_path(self, path: str) -> bool:
        if self.errors:
            raise self.errors.pop(0)
        self.created.append(path)
        return True


def test_connection_loss_timeouts_and_session_expiry_are_retried() -> None:
    client = _Flaky([ConnectionLoss(), OperationTimeoutError(), SessionExpiredError(), ConnectionLoss()])
    ensure_path(client, "/admin/controlled_shutdown")  # type: ignore[arg-type]
    assert client.created == ["/admin/controlled_shutdown"]
    assert len(client.slept) == 4  # one back-off per failed attempt
    assert max(client.slept) <= 1.0 + 0.4  # max_delay plus kazoo's jitter: no hour-long back-off


def test_a_zookeeper_that_never_comes_back_still_ends_the_start() -> None:
    client = _Flaky([ConnectionLoss()] * 10_000)
    with pytest.raises(RetryFailedError):
        # the sleeps are recorded, not slept: the deadline is what ends it
        ensure_path(client, "/x", deadline_s=0.0)  # type: ignore[arg-type]
    assert client.created == []


def test_errors_that_are_not_about_the_connection_are_not_retried() -> None:
    client = _Flaky([NoAuthError()])
    with pytest.raises(NoAuthError):
        ensure_path(client, "/x")  # type: ignore[arg-type]
    assert client.slept == []
