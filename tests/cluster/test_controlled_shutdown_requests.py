"""Controlled-shutdown request znodes: their JSON, which requests are in effect (broker epochs),
and the kazoo side against a real ZooKeeper (ephemeral sequential children, watched)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from exactly.cluster.controlled_shutdown import (
    CONTROLLED_SHUTDOWN,
    ShutdownRequest,
    ShutdownRequests,
    broker_of_child,
    in_effect,
)
from exactly.cluster.zk import ClusterZk
from exactly.cluster.znodes import ZnodeFormatError
from tests.cluster.helpers import wait_for


def test_request_json_round_trips_and_bad_data_is_refused() -> None:
    request = ShutdownRequest(3, 4294967301)
    assert request.encode() == b'{"version":1,"broker":3,"broker_epoch":4294967301}'
    assert ShutdownRequest.decode(request.encode()) == request
    for bad in (b"", b"[]", b'{"broker":3}', b'{"broker":"3","broker_epoch":1}', b"\xff"):
        with pytest.raises(ZnodeFormatError):
            ShutdownRequest.decode(bad)


def test_child_names() -> None:
    assert broker_of_child("3-0000000012") == 3
    for other in ("3", "x-0000000001", "3-", "-0000000001", "lock"):
        assert broker_of_child(other) is None


def test_only_requests_of_the_current_incarnation_are_in_effect() -> None:
    live = {1: 100, 2: 200}
    requests = [ShutdownRequest(1, 100), ShutdownRequest(2, 150), ShutdownRequest(3, 300)]
    # 2 asked in an earlier incarnation (Kafka: STALE_BROKER_EPOCH); 3 is not registered at all
    assert in_effect(requests, live) == {1}


def test_requests_are_ephemeral_sequential_children_seen_by_watchers(
    cluster_zk: Callable[[], ClusterZk],
) -> None:
    asking, watching = cluster_zk(), cluster_zk()
    seen: list[frozenset[int]] = []
    ShutdownRequests(watching.client).watch(seen.append)
    wait_for(lambda: seen == [frozenset()], what="the first callback")
    requests = ShutdownRequests(asking.client)
    first = requests.request(1, 11)
    wait_for(lambda: seen[-1] == {1}, what="the first attempt")
    notified = len(seen)
    # a retry (attempts are a back-off apart): a new child, so the watch fires again
    second = requests.request(1, 11)
    assert first != second and first.startswith(f"{CONTROLLED_SHUTDOWN}/1-")
    wait_for(lambda: len(seen) > notified, what="the second attempt")
    assert ShutdownRequests(watching.client).read() == [ShutdownRequest(1, 11)] * 2
    asking.stop()  # the session ends: the requests go with it
    wait_for(lambda: seen[-1] == frozenset(), what="the requests to vanish")
    assert ShutdownRequests(watching.client).read() == []
