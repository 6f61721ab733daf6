"""Broker configuration: Kafka names and defaults, overrides, and refusal of unknown names."""

from __future__ import annotations

from pathlib import Path

import pytest

from exactly.server.config import BrokerConfig, ConfigError, parse_properties


def test_defaults_match_kafka() -> None:
    cfg = BrokerConfig.load(None, {})
    assert cfg.get_int("num.partitions") == 1
    assert cfg.get_bool("auto.create.topics.enable") is True
    assert cfg.get_int("socket.request.max.bytes") == 104_857_600
    log = cfg.log_config()
    assert log.retention_ms == 7 * 24 * 3600 * 1000
    assert log.segment_bytes == 1_073_741_824
    assert log.segment_ms == 7 * 24 * 3600 * 1000
    assert log.max_message_bytes == 1_048_588


def test_file_then_overrides(tmp_path: Path) -> None:
    props = tmp_path / "server.properties"
    props.write_text("# comment\nnum.partitions=3\nlog.retention.hours = 1\nlog.segment.bytes: 2048\n")
    cfg = BrokerConfig.load(props, {"num.partitions": "5"})
    assert cfg.get_int("num.partitions") == 5
    assert cfg.log_config().retention_ms == 3_600_000
    assert cfg.log_config().segment_bytes == 2048
    assert BrokerConfig.load(None, {"log.retention.ms": "10"}).log_config().retention_ms == 10


def test_unknown_names_and_bad_values_are_refused() -> None:
    with pytest.raises(ConfigError, match="unknown broker config"):
        BrokerConfig.load(None, {"num.partition": "3"})
    with pytest.raises(ConfigError, match="must be an integer"):
        BrokerConfig.load(None, {"log.segment.bytes": "big"})
    with pytest.raises(ConfigError):
        parse_properties("just-a-word\n")
    with pytest.raises(ConfigError, match="true or false"):
        BrokerConfig.load(None, {"auto.create.topics.enable": "yes"}).get_bool("auto.create.topics.enable")
