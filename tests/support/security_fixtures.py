"""Fixtures of the test modules that run against the secured broker (tests/support/security.py's
four listeners). A module takes them with ``from tests.support.security_fixtures import ...``; each
module gets its own broker (``module_broker`` with these settings) and its own certificates. The
functions have names of their own (``name=`` gives the fixture's), so importing them does not clash
with the test functions' parameters."""

from __future__ import annotations

import pytest

from tests.support.broker import Broker
from tests.support.certs import TestPki, make_pki
from tests.support.security import add_alice, secured_broker_config


@pytest.fixture(scope="module", name="pki")
def pki_fixture(tmp_path_factory: pytest.TempPathFactory) -> TestPki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module", name="module_broker_config")
def secured_broker_config_fixture(pki: TestPki) -> dict[str, str]:
    return secured_broker_config(pki)


@pytest.fixture(scope="module", name="_alice")
def alice_fixture(_module_broker: Broker) -> None:
    add_alice(_module_broker)  # stored in the data directory: survives restarts


@pytest.fixture(name="sb")
def secured_broker_fixture(module_broker: Broker, _alice: None) -> Broker:
    """The secured broker, with user alice (both SCRAM mechanisms)."""
    return module_broker
