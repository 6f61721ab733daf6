"""Configuring the brokers of a whole module by overriding ``exactly_broker_config``; a marker on
a test wins over it, name by name."""

from __future__ import annotations

import pytest


@pytest.fixture
def exactly_broker_config():
    return {"num.partitions": 2, "log.retention.ms": 60_000}


def test_the_overriding_fixture_configures_the_broker(exactly_broker):
    assert exactly_broker.config == {"num.partitions": "2", "log.retention.ms": "60000"}
    assert exactly_broker.launcher.overrides == exactly_broker.config


@pytest.mark.exactly_config({"num.partitions": 7})
def test_a_marker_wins_over_the_fixture(exactly_broker):
    assert exactly_broker.config == {"num.partitions": "7", "log.retention.ms": "60000"}
