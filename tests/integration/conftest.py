"""Fixtures shared by the consumer-group test modules: ``gb``, the module's broker with
group.initial.rebalance.delay.ms=0 (so a lone consumer's first assignment does not wait), and a
unique group id per test. Modules that need other settings define their own
``module_broker_config``."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.support.broker import Broker

FAST_GROUPS = {"group.initial.rebalance.delay.ms": "0"}


@pytest.fixture(scope="module")
def module_broker_config(request: pytest.FixtureRequest) -> dict[str, str]:
    return {**FAST_GROUPS, **getattr(request, "param", {})}


@pytest.fixture
def gb(module_broker: Broker) -> Broker:
    """The module's group broker (restarted if a previous test stopped it)."""
    return module_broker


@pytest.fixture
def group(unique_name: Callable[[str], str]) -> str:
    return unique_name("g")
