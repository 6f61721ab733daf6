"""Shared fixtures: real broker subprocesses, a fault proxy, unique topic names, kcat.

* ``broker`` - one broker for the whole session (cheap tests; never kill or restart it).
* ``module_broker`` - one broker per test module with the settings of the module's
  ``module_broker_config`` fixture (default: none), restarted if an earlier test stopped it.
* ``fresh_broker`` - a factory for private brokers (``fresh_broker(**{"log.segment.bytes": "1024"})``)
  that a test may stop, kill -9 and restart; all are shut down after the test.
* ``proxied_broker`` - a factory for a private broker behind a ``FaultProxy``; clients bootstrap to
  ``pb.bootstrap`` (the proxy) and the broker advertises the proxy's address.
* ``topic`` - a unique topic name per test.

When a test fails, the output of every broker it used (from the test's start) is attached to the
report as a section, so a broker-side traceback shows up next to the assertion.
"""

from __future__ import annotations

import re
import shutil
import uuid
from collections.abc import Callable, Generator, Iterator, Mapping
from pathlib import Path
from typing import Any

import hypothesis
import pytest

from tests.support import shared_zookeeper
from tests.support.broker import Broker
from tests.support.kcat import ensure_kcat
from tests.support.proxy import FaultProxy, ProxiedBroker
from tests.support.reporting import broker_sections, note_broker

# The package's pytest plugin (exactly_broker, exactly_cluster, ...): an installed package registers
# it through its pytest11 entry point (of the same name, so it is not registered twice); this
# loads it from the source tree when the installed metadata predates it.
# tests.support.scheduling: how `make test` spreads the suite over its two xdist workers.
pytest_plugins = ["exactly.testing.pytest_plugin", "tests.support.scheduling"]

_SHARED_ZK = pytest.StashKey[str | None]()

# Hypothesis without timing checks for every property test: its 200 ms per-example deadline and
# its "too slow" health check fail on a loaded box (a model test exceeded the deadline at load
# 10-15) and assert nothing about behaviour; performance lives in bench/. A test's own
# ``@settings`` still sets the rest (max_examples), inheriting these.
hypothesis.settings.register_profile(
    "exactly", deadline=None, suppress_health_check=[hypothesis.HealthCheck.too_slow]
)
hypothesis.settings.load_profile("exactly")


def pytest_configure(config: pytest.Config) -> None:
    # kafka-python 3.0 loads its schemas with importlib.resources APIs deprecated in 3.11
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:kafka.protocol.schemas.load_json")
    config.addinivalue_line(
        "filterwarnings", "ignore:.*is deprecated. Use files\\(\\) instead:DeprecationWarning"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Install kcat (if missing) before any test runs, outside every test's timeout. (The Spark
    xdist group and the order the tests are handed out in: tests/support/scheduling.py.)"""
    if any("kcat" in getattr(item, "fixturenames", ()) for item in items):
        ensure_kcat()


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under pytest-xdist the controller starts the run's one ZooKeeper before the workers start."""
    if shared_zookeeper.is_xdist_controller(session.config):
        session.config.stash[_SHARED_ZK] = shared_zookeeper.start_for_workers()


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: absent when xdist is not installed
def pytest_configure_node(node: Any) -> None:
    node.workerinput[shared_zookeeper.WORKERINPUT_KEY] = node.config.stash.get(_SHARED_ZK, None)


def pytest_unconfigure(config: pytest.Config) -> None:
    if shared_zookeeper.is_xdist_controller(config):
        shared_zookeeper.stop_for_workers()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        report.sections.extend(broker_sections(item))
    return report


# ------------------------------------------------------------------ brokers
@pytest.fixture(scope="session")
def _session_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    base = tmp_path_factory.mktemp("session-broker")
    broker = Broker(base / "data", base / "broker.log", name="session-broker")
    try:
        broker.start()
        yield broker
    finally:
        broker.close()


@pytest.fixture
def broker(_session_broker: Broker, request: pytest.FixtureRequest) -> Broker:
    """The shared broker. Tests must not stop, kill or restart it."""
    if not _session_broker.running:  # an earlier test broke it: say so, then carry on
        _session_broker.restart()
    note_broker(request, _session_broker)
    return _session_broker


@pytest.fixture(scope="module")
def module_broker_config(request: pytest.FixtureRequest) -> dict[str, str]:
    """Settings (``-o key=value``) of the requesting module's ``module_broker``.

    The parameter of ``module_broker``: a test module (or a conftest) configures its broker by
    defining a fixture of this name, e.g.
    ``@pytest.fixture(scope="module") def module_broker_config(): return {"num.partitions": "3"}``,
    or runs its tests against several configurations with
    ``@pytest.mark.parametrize("module_broker_config", [{...}, {...}], indirect=True)`` (one
    broker per configuration)."""
    return dict(getattr(request, "param", {}))


@pytest.fixture(scope="module")
def _module_broker(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    module_broker_config: Mapping[str, str],
) -> Iterator[Broker]:
    name = request.module.__name__.rsplit(".", 1)[-1]
    base = tmp_path_factory.mktemp(name)
    b = Broker(base / "data", base / "broker.log", overrides=module_broker_config, name=f"{name}-broker")
    try:
        b.start()
        yield b
    finally:
        b.close()


@pytest.fixture
def module_broker(_module_broker: Broker, request: pytest.FixtureRequest) -> Broker:
    """One broker per test module, configured by ``module_broker_config``. Tests may stop, kill
    or restart it: the next test gets it running again (on the same data dir)."""
    if not _module_broker.running:
        _module_broker.restart()
    note_broker(request, _module_broker)
    return _module_broker


BrokerFactory = Callable[..., Broker]


@pytest.fixture
def fresh_broker(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[BrokerFactory]:
    """Factory: ``fresh_broker(start=True, config_file=None, env=None, **overrides)`` -> a private Broker.

    ``env`` adds environment variables for the broker process (``broker.env``, editable between
    restarts), e.g. ``{"EXACTLY_FAULT": "crash-after-prepare"}``."""
    made: list[Broker] = []

    def make(
        *,
        start: bool = True,
        config_file: Path | None = None,
        env: Mapping[str, str] | None = None,
        **overrides: str,
    ) -> Broker:
        n = len(made) + 1
        b = Broker(
            tmp_path / f"broker{n}" / "data",
            tmp_path / f"broker{n}" / "broker.log",
            overrides={k.replace("_", "."): str(v) for k, v in overrides.items()},
            config_file=config_file,
            name=f"broker{n}",
            env=env,
        )
        made.append(b)
        note_broker(request, b, since=0)
        if start:
            b.start()
        return b

    yield make
    for b in made:
        b.close()


ProxiedFactory = Callable[..., ProxiedBroker]


@pytest.fixture
def proxied_broker(fresh_broker: BrokerFactory) -> Iterator[ProxiedFactory]:
    proxies: list[FaultProxy] = []

    def make(**overrides: str) -> ProxiedBroker:
        proxy = FaultProxy().start()
        proxies.append(proxy)
        overrides = {k.replace("_", "."): v for k, v in overrides.items()}
        overrides["advertised.listeners"] = proxy.advertised_listener
        b = fresh_broker(**overrides)
        proxy.set_upstream(b.host, b.port or 0)
        return ProxiedBroker(b, proxy)

    yield make
    for proxy in proxies:
        proxy.close()


# ------------------------------------------------------------------ names, tools
_UNSAFE = re.compile(r"[^a-zA-Z0-9._-]+")


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic name no other test uses."""
    base = _UNSAFE.sub("-", request.node.name).strip("-")[:60]
    return f"t-{base}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """``unique_name("x")`` -> another fresh topic name, for tests that need several."""

    def make(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:10]}"

    return make


@pytest.fixture(scope="session")
def kcat() -> str:
    """Path to kcat; installs it with apt-get when missing and possible, else skips."""
    path, reason = ensure_kcat()
    if path is None:
        pytest.skip(reason)
    return path


# ONE local SparkSession for the whole test session (tests/spark and the cluster pipeline test):
# Spark takes 10-20 s to start. ``local[2,4]``: 2 threads, a failed task is retried up to 4 times
# (the retry tests need it); UI off, 2 shuffle partitions, loopback only, ``src`` on the workers'
# PYTHONPATH. Tests use unique topic names and checkpoint dirs so they never see each other's data.
MASTER = "local[2,4]"


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    if shutil.which("java") is None:
        pytest.skip("java is not installed (make system-deps)")
    from exactly.spark.session import build_session

    session = build_session(
        MASTER,
        "exactly-tests",
        {"spark.sql.shuffle.partitions": "2", "spark.sql.streaming.noDataMicroBatches.enabled": "false"},
        log_level="ERROR",
    )
    try:
        yield session
    finally:
        session.stop()
