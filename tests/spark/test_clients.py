"""The per-worker client pool (``clients.py``), with stand-in clients (no broker needed)."""

from __future__ import annotations

import time
from typing import Any

from exactly.spark import clients, sink
from exactly.spark.options import parse_sink_options


class FakeConsumer:
    def __init__(self, conf: dict[str, Any]) -> None:
        self.conf = conf
        self.assigned = True
        self.closed = False

    def unassign(self) -> None:
        self.assigned = False

    def close(self) -> None:
        self.closed = True


def test_a_healthy_consumer_is_reused_unassigned_and_a_failed_one_closed() -> None:
    conf = {"bootstrap.servers": "test-reuse:1"}
    first, reused = clients.borrow("test", conf, FakeConsumer)
    assert not reused
    clients.give_back("test", conf, first, healthy=True)
    assert not first.assigned and not first.closed
    again, reused = clients.borrow("test", conf, FakeConsumer)
    assert (again, reused) == (first, True)
    other, reused = clients.borrow("test", {"bootstrap.servers": "test-reuse:2"}, FakeConsumer)
    assert other is not first and not reused
    clients.give_back("test", conf, again, healthy=False)
    assert again.closed
    fresh, reused = clients.borrow("test", conf, FakeConsumer)
    assert fresh is not again and not reused


def test_idle_clients_are_closed() -> None:
    conf = {"bootstrap.servers": "test-idle:1"}
    consumer, _ = clients.borrow("test", conf, FakeConsumer)
    clients.give_back("test", conf, consumer, healthy=True)
    shared = clients.shared("test", conf, FakeConsumer)
    assert clients.shared("test", conf, FakeConsumer) is shared
    assert clients.close_idle(time.monotonic() + 1) >= 2
    assert consumer.closed and shared.closed
    assert clients.shared("test", conf, FakeConsumer) is not shared


def test_sink_producers_connect_eagerly_unless_the_user_overrides_it() -> None:
    """Sparse connections put a 500 ms librdkafka retry on a new producer's producer-id look-up."""
    eager = parse_sink_options({"kafka.bootstrap.servers": "b:1", "topic": "t"})
    assert sink._producer_conf(eager)["enable.sparse.connections"] is False
    sparse = parse_sink_options(
        {"kafka.bootstrap.servers": "b:1", "topic": "t", "kafka.enable.sparse.connections": "true"}
    )
    assert sink._producer_conf(sparse)["enable.sparse.connections"] == "true"
