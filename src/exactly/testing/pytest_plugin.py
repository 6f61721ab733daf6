"""pytest fixtures for testing Kafka applications against a real ``exactly`` broker.

Installed with the package and registered through the ``pytest11`` entry point, so a project that
``pip install``s ``exactly`` gets these fixtures with no conftest (``-p no:exactly.testing.pytest_plugin``
turns them off):

* ``exactly_broker`` - a fresh broker for the test (function scope): ``.bootstrap_servers``.
* ``exactly_broker_session`` - one broker shared by the whole session.
* ``exactly_broker_factory`` - ``factory(config=None)`` starts another broker (several brokers,
  or several configurations, in one test); all are stopped after the test.
* ``exactly_cluster`` - ZooKeeper and three brokers, with ``kill(i)``, ``stop(i)``,
  ``restart(i)``, ``leader(topic, partition)`` and ``wait_for_leader(...)`` (a wait that runs out
  raises :class:`~exactly.testing.harness.ClusterTimeout`, a ``TimeoutError``); the test is
  skipped, with the reason, when Java or ZooKeeper is not installed.

Configuration uses Kafka's broker config names. Either mark the test,
``@pytest.mark.exactly_config({"num.partitions": 3})`` (applies to ``exactly_broker`` and
``exactly_cluster``), or override a fixture: ``exactly_broker_config`` (function scope),
``exactly_broker_session_config`` (session scope), ``exactly_cluster_config``; the marker wins
over the fixture, name by name.

Every broker runs on a free loopback port with its own temporary directory; teardown stops it
(SIGKILL if it does not stop) and removes the directory even when the test failed. When a test
that used a broker fails, the tail of each broker's log is added to its report.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Mapping
from contextlib import ExitStack
from typing import Any

import pytest

from exactly.testing.harness import BrokerHandle, ClusterHandle, broker, cluster, zookeeper_missing

MARKER = "exactly_config"
LOG_TAIL_CHARS = 4_000

BrokerFactory = Callable[..., BrokerHandle]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(config): Kafka broker config (a dict of config names) for exactly_broker and exactly_cluster",
    )


def _with_marker(request: pytest.FixtureRequest, base: Mapping[str, object]) -> dict[str, object]:
    merged = dict(base)
    for mark in reversed(list(request.node.iter_markers(MARKER))):  # closest marker last: it wins
        for given in mark.args:
            merged.update(dict(given))
        merged.update(mark.kwargs)
    return merged


def _handles(value: object) -> list[BrokerHandle]:
    if isinstance(value, BrokerHandle):
        return [value]
    if isinstance(value, ClusterHandle):
        return value.brokers
    return list(getattr(value, "exactly_started", ()))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test that used a broker gets the tail of each broker's log in its report."""
    report = yield
    if call.when == "call" and report.failed:
        for value in getattr(item, "funcargs", {}).values():
            for handle in _handles(value):
                tail = handle.log_text()[-LOG_TAIL_CHARS:]
                report.sections.append((f"exactly {handle.launcher.name} log (tail)", tail))
    return report


@pytest.fixture
def exactly_broker_config() -> dict[str, object]:
    """Broker config of ``exactly_broker`` (override it in a conftest or test module)."""
    return {}


@pytest.fixture(scope="session")
def exactly_broker_session_config() -> dict[str, object]:
    """Broker config of ``exactly_broker_session`` (override it with a session-scoped fixture)."""
    return {}


@pytest.fixture
def exactly_cluster_config() -> dict[str, object]:
    """Broker config of every ``exactly_cluster`` broker, over the cluster defaults."""
    return {}


@pytest.fixture
def exactly_broker(
    request: pytest.FixtureRequest, exactly_broker_config: dict[str, object]
) -> Iterator[BrokerHandle]:
    """A fresh broker for this test: ``exactly_broker.bootstrap_servers``."""
    with broker(_with_marker(request, exactly_broker_config)) as handle:
        yield handle


@pytest.fixture(scope="session")
def exactly_broker_session(exactly_broker_session_config: dict[str, object]) -> Iterator[BrokerHandle]:
    """One broker for the whole session (tests share its topics: use unique names)."""
    with broker(exactly_broker_session_config) as handle:
        yield handle


@pytest.fixture
def exactly_broker_factory() -> Iterator[BrokerFactory]:
    """``factory(config=None, **broker_kwargs)`` starts another broker; all stop after the test."""
    with ExitStack() as stack:
        started: list[BrokerHandle] = []

        def make(config: Mapping[str, object] | None = None, **kwargs: Any) -> BrokerHandle:
            handle = stack.enter_context(broker(config, **kwargs))
            started.append(handle)
            return handle

        make.exactly_started = started  # type: ignore[attr-defined]  # for the failure report
        yield make


@pytest.fixture
def exactly_cluster(
    request: pytest.FixtureRequest, exactly_cluster_config: dict[str, object]
) -> Iterator[ClusterHandle]:
    """ZooKeeper and three brokers; skipped (with the reason) without Java or ZooKeeper."""
    missing = zookeeper_missing()
    if missing is not None:
        pytest.skip(f"exactly_cluster needs ZooKeeper: {missing}")
    with cluster(_with_marker(request, exactly_cluster_config)) as handle:
        yield handle
