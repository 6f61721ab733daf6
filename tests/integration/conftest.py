"""Fixtures shared by the consumer-group test modules: one broker per module with
group.initial.rebalance.delay.ms=0 (so a lone consumer's first assignment does not wait), restarted
if a test killed it, and a unique group id per test."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.support.broker import Broker
from tests.support.reporting import note_broker

FAST_GROUPS = {"group.initial.rebalance.delay.ms": "0"}


@pytest.fixture(scope="module")
def _groups_broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Broker]:
    base = tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])
    b = Broker(base / "data", base / "broker.log", overrides=FAST_GROUPS, name="groups-broker")
    try:
        b.start()
        yield b
    finally:
        b.close()


@pytest.fixture
def gb(_groups_broker: Broker, request: pytest.FixtureRequest) -> Broker:
    """The module's group broker (restarted if a previous test stopped it)."""
    if not _groups_broker.running:
        _groups_broker.restart()
    note_broker(request, _groups_broker)
    return _groups_broker


@pytest.fixture
def group(unique_name: Callable[[str], str]) -> str:
    return unique_name("g")
