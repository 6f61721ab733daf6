"""Start-up ZooKeeper calls survive a dropped connection, and their retries stay correct.

``/cluster/id`` (``get_or_create_cluster_id``) and the first producer-id block (the prefetch)
went to kazoo without retry; a restarting broker died on one dropped ZooKeeper connection at
``ensure_path`` before (``bench/results/txnbounce-s19.md``). Both are now called through
``zk_base.call_with_retry``. The client here is a stand-in for kazoo's only to drop the connection
on demand, *before* or *after* the server applied the request (the answer is lost): what is
tested is that a retry after a write that did happen neither fails nor hands out a block twice.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from kazoo.exceptions import BadVersionError, ConnectionLoss, NodeExistsError, NoNodeError

from exactly.cluster import znodes as zn
from exactly.cluster.producer_ids import ZkProducerIdManager, allocate_block
from exactly.cluster.zk_base import call_with_retry
from exactly.cluster.zk_topics import ZkTopics
from exactly.cluster.znodes import ProducerIdBlock


class _Zk:
    """Znodes in a dict; ``drops`` lists ``(method, "before" | "after")``: the next call of that
    method loses the connection before the server applies it, or after (the answer is lost)."""

    def __init__(self) -> None:
        self.nodes: dict[str, tuple[bytes, int]] = {}
        self.drops: list[tuple[str, str]] = []
        self.slept: list[float] = []
        self.handler = SimpleNamespace(sleep_func=self.slept.append, spawn=lambda f: f())

    def _call(self, method: str, apply: Callable[[], Any]) -> Any:
        when = next((w for m, w in self.drops if m == method), None)
        if when is not None:
            self.drops.remove((method, when))
            if when == "after":
                apply()
            raise ConnectionLoss()
        return apply()

    def get(self, path: str) -> tuple[bytes, SimpleNamespace]:
        def apply() -> tuple[bytes, SimpleNamespace]:
            if path not in self.nodes:
                raise NoNodeError()
            data, version = self.nodes[path]
            return data, SimpleNamespace(version=version)

        result: tuple[bytes, SimpleNamespace] = self._call("get", apply)
        return result

    def create(self, path: str, data: bytes) -> str:
        def apply() -> str:
            if path in self.nodes:
                raise NodeExistsError()
            self.nodes[path] = (data, 0)
            return path

        return str(self._call("create", apply))

    def set(self, path: str, data: bytes, version: int = -1) -> None:
        def apply() -> None:
            if path not in self.nodes:
                raise NoNodeError()
            current = self.nodes[path][1]
            if version not in (-1, current):
                raise BadVersionError()
            self.nodes[path] = (data, current + 1)

        self._call("set", apply)

    def ensure_path(self, path: str) -> bool:
        def apply() -> bool:
            self.nodes.setdefault(path, (b"", 0))
            return True

        return bool(self._call("ensure_path", apply))


def topics(client: _Zk) -> ZkTopics:
    holder = ZkTopics()
    holder.client = client  # type: ignore[assignment]
    return holder


def test_call_with_retry_returns_the_answer_of_the_attempt_that_got_through() -> None:
    client = _Zk()
    client.nodes["/a"] = (b"x", 3)
    client.drops = [("get", "before"), ("get", "after")]
    data, stat = call_with_retry(client, client.get, "/a")  # type: ignore[arg-type]
    assert (data, stat.version) == (b"x", 3)
    assert len(client.slept) == 2


@pytest.mark.parametrize("when", ["before", "after"])
def test_the_first_broker_writes_its_cluster_id_even_if_the_create_answer_is_lost(when: str) -> None:
    client = _Zk()
    client.drops = [("get", "before"), ("create", when)]
    assert topics(client).get_or_create_cluster_id("candidate-id") == "candidate-id"
    assert zn.decode_cluster_id(client.nodes[zn.CLUSTER_ID][0]) == "candidate-id"


def test_a_later_broker_takes_the_id_that_is_there_through_a_dropped_connection() -> None:
    client = _Zk()
    client.nodes[zn.CLUSTER_ID] = (zn.encode_cluster_id("first"), 0)
    client.drops = [("get", "before")]
    assert topics(client).get_or_create_cluster_id("mine") == "first"
    assert zn.decode_cluster_id(client.nodes[zn.CLUSTER_ID][0]) == "first"


def test_a_lost_answer_to_an_applied_block_write_skips_that_block_and_never_reuses_it() -> None:
    client = _Zk()
    assert allocate_block(client, 1, 10, deadline_s=60) == ProducerIdBlock(1, 0, 9)  # type: ignore[arg-type]
    # broker 1's set is applied, its answer lost: the retry re-reads, sees its own block 10..19
    # as the latest and takes 20..29; 10..19 is skipped, nobody hands it out
    client.drops = [("set", "after")]
    taken = allocate_block(client, 1, 10, deadline_s=60)  # type: ignore[arg-type]
    assert taken == ProducerIdBlock(1, 20, 29)
    # another broker continues after it: the blocks stay disjoint
    assert allocate_block(client, 2, 10, deadline_s=60) == ProducerIdBlock(2, 30, 39)  # type: ignore[arg-type]


def test_a_block_write_lost_before_it_was_applied_is_retried_for_the_same_block() -> None:
    client = _Zk()
    client.drops = [("get", "before"), ("ensure_path", "after"), ("set", "before")]
    assert allocate_block(client, 3, 10, deadline_s=60) == ProducerIdBlock(3, 0, 9)  # type: ignore[arg-type]
    assert ProducerIdBlock.decode(client.nodes[zn.LATEST_PRODUCER_ID_BLOCK][0]) == ProducerIdBlock(3, 0, 9)


def test_without_a_deadline_one_attempt_raises_the_connection_error() -> None:
    """``generate``'s synchronous fetch runs on the event loop: it must not wait out an outage."""
    client = _Zk()
    client.drops = [("get", "before")]
    with pytest.raises(ConnectionLoss):
        allocate_block(client, 1, 10)  # type: ignore[arg-type]
    assert client.slept == []


def test_the_start_up_prefetch_survives_a_dropped_connection() -> None:
    client = _Zk()
    client.drops = [("get", "before"), ("set", "after")]
    manager = ZkProducerIdManager(client, 4, block_size=10)  # type: ignore[arg-type]
    manager.prefetch()  # the stand-in runs the spawned fetch at once
    assert manager.has_block
    ids = [manager.generate() for _ in range(3)]
    # the lost-but-applied write took 0..9 and is skipped; the retry took 10..19
    assert ids == [10, 11, 12]
    assert ProducerIdBlock.decode(client.nodes[zn.LATEST_PRODUCER_ID_BLOCK][0]) == ProducerIdBlock(4, 10, 19)
