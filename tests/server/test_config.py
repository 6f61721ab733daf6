"""Broker configuration: Kafka names and defaults, overrides, and refusal of unknown names."""

from __future__ import annotations

from pathlib import Path

import pytest

from exactly.server.config import BrokerConfig, ConfigError, parse_properties
from exactly.storage.config import InvalidConfigError


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


def test_cluster_mode_is_off_without_zookeeper_connect() -> None:
    cfg = BrokerConfig.load(None, {})
    assert cfg.cluster_mode is False
    assert cfg.node_id == 0


def test_cluster_mode_takes_broker_id() -> None:
    cfg = BrokerConfig.load(None, {"zookeeper.connect": "127.0.0.1:2181/kafka", "broker.id": "3"})
    assert cfg.cluster_mode is True
    assert cfg.node_id == 3
    assert cfg.get_int("zookeeper.session.timeout.ms") == 18_000  # Kafka's default
    # Kafka's defaults of controlled shutdown and the automatic preferred-leader rebalance
    assert cfg.get_bool("controlled.shutdown.enable") is True
    assert cfg.get_int("controlled.shutdown.max.retries") == 3
    assert cfg.get_int("controlled.shutdown.retry.backoff.ms") == 5000
    assert cfg.get_bool("auto.leader.rebalance.enable") is True
    assert cfg.get_int("leader.imbalance.check.interval.seconds") == 300
    assert cfg.get_int("leader.imbalance.per.broker.percentage") == 10


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"broker.id": "1", "node.id": "2"}, "broker.id and node.id differ"),
        ({"zookeeper.connect": "h:1", "broker.id": "-1"}, "broker.id must be >= 0"),
        ({"zookeeper.connect": "h:1", "zookeeper.session.timeout.ms": "0"}, "session.timeout"),
        ({"zookeeper.connect": "h:1", "unclean.leader.election.enable": "maybe"}, "true or false"),
        ({"default.replication.factor": "3"}, "needs zookeeper.connect"),
        ({"zookeeper.connect": "h:1", "controlled.shutdown.enable": "yes"}, "true or false"),
        ({"zookeeper.connect": "h:1", "controlled.shutdown.max.retries": "-1"}, "must not be negative"),
        ({"zookeeper.connect": "h:1", "leader.imbalance.check.interval.seconds": "0"}, "must be positive"),
        ({"zookeeper.connect": "h:1", "auto.leader.rebalance.enable": "1"}, "true or false"),
    ],
)
def test_refused_cluster_combinations(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        BrokerConfig.load(None, overrides)


SASL_CLUSTER = {
    "zookeeper.connect": "h:1",
    "listeners": "SASL_PLAINTEXT://127.0.0.1:0",
    "inter.broker.listener.name": "SASL_PLAINTEXT",
    "sasl.enabled.mechanisms": "SCRAM-SHA-512",
}
SCRAM_JAAS = (
    'org.apache.kafka.common.security.scram.ScramLoginModule required username="broker" password="pw";'
)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (SASL_CLUSTER, "inter-broker listener SASL_PLAINTEXT uses SASL_PLAINTEXT: set sasl.mechanism"),
        (
            {**SASL_CLUSTER, "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512"},
            "credentials are missing; set listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config",
        ),
        (
            {**SASL_CLUSTER, "security.inter.broker.protocol": "SASL_PLAINTEXT"},
            "only one of inter.broker.listener.name and security.inter.broker.protocol",
        ),
        (
            {
                "zookeeper.connect": "h:1",
                "listeners": "SSL://127.0.0.1:0",
                "security.inter.broker.protocol": "SASL_SSL",
            },
            "inter-broker listener SASL_SSL is not one of the listeners",
        ),
        (
            {"listener.name.sasl_plaintext.sasl.mechanism.inter.broker.protocol": "PLAIN"},
            "unknown broker config",
        ),
    ],
)
def test_unusable_inter_broker_security_is_refused_at_start_up(
    overrides: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        BrokerConfig.load(None, overrides)


def test_a_secured_inter_broker_listener_is_accepted_in_a_cluster() -> None:
    cfg = BrokerConfig.load(
        None,
        {
            **SASL_CLUSTER,
            "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
            "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": SCRAM_JAAS,
        },
    )
    settings = cfg.inter_broker_security()
    assert (settings.listener, settings.mechanism, settings.username) == (
        "SASL_PLAINTEXT",
        "SCRAM-SHA-512",
        "broker",
    )
    # the same settings without a cluster: nothing connects to another broker, nothing is checked
    assert BrokerConfig.load(None, {k: v for k, v in SASL_CLUSTER.items() if k != "zookeeper.connect"})


def test_unclean_leader_election_is_a_topic_config_defaulting_to_the_brokers() -> None:
    """Kafka's topic-level ``unclean.leader.election.enable``: CreateTopics and DescribeConfigs
    know it; the topic default is the broker's setting; only true/false are accepted."""
    assert BrokerConfig.load(None, {}).log_config().unclean_leader_election_enable == "false"
    cfg = BrokerConfig.load(None, {"unclean.leader.election.enable": "true"})
    log = cfg.log_config()
    assert log.unclean_leader_election_enable == "true"
    assert log.as_kafka_configs()["unclean.leader.election.enable"] == "true"
    override = log.with_overrides({"unclean.leader.election.enable": "False"})
    assert override.unclean_leader_election_enable == "false"
    with pytest.raises(InvalidConfigError, match="Invalid value"):
        log.with_overrides({"unclean.leader.election.enable": "sometimes"})


def test_log_cleaner_settings_and_broker_level_compaction_defaults() -> None:
    cfg = BrokerConfig.load(None, {})
    cleaner = cfg.cleaner_config()
    assert cleaner.enable and cleaner.num_threads == 1
    assert cleaner.dedupe_buffer_size == 128 * 1024 * 1024 and cleaner.backoff_ms == 15_000
    assert cleaner.io_buffer_load_factor == 0.9
    log = cfg.log_config()
    assert (log.cleanup_policy, log.min_cleanable_dirty_ratio, log.delete_retention_ms) == (
        "delete",
        0.5,
        86_400_000,
    )
    assert (log.min_compaction_lag_ms, log.max_compaction_lag_ms) == (0, 2**63 - 1)
    cfg = BrokerConfig.load(
        None,
        {
            "log.cleaner.threads": "2",
            "log.cleaner.dedupe.buffer.size": str(4 * 1024 * 1024),
            "log.cleaner.io.max.bytes.per.second": "1048576",
            "log.cleaner.cpu.max.share": "0.5",
            "log.cleaner.min.cleanable.ratio": "0.25",
            "log.cleaner.delete.retention.ms": "1000",
            "log.cleaner.min.compaction.lag.ms": "5",
            "log.cleaner.max.compaction.lag.ms": "60000",
            "log.cleanup.policy": "compact,delete",
        },
    )
    assert cfg.cleaner_config().map_memory_per_thread == 2 * 1024 * 1024
    assert cfg.cleaner_config().max_io_bytes_per_second == 1048576.0
    assert cfg.cleaner_config().max_cpu_share == 0.5
    # exactly's own setting defaults to a share of a core below 1 (Kafka: unlimited, 1.0 here).
    assert 0 < BrokerConfig.load(None, {}).cleaner_config().max_cpu_share < 1
    log = cfg.log_config()
    assert (log.min_cleanable_dirty_ratio, log.delete_retention_ms, log.min_compaction_lag_ms) == (
        0.25,
        1000,
        5,
    )
    assert log.max_compaction_lag_ms == 60_000 and log.compact and log.delete
    # A topic override wins over the broker-level form, under Kafka's topic name.
    assert log.with_overrides({"min.cleanable.dirty.ratio": "0.9"}).min_cleanable_dirty_ratio == 0.9


@pytest.mark.parametrize(
    "overrides",
    [
        {"log.cleaner.min.cleanable.ratio": "1.5"},
        {"log.cleaner.min.cleanable.ratio": "half"},
        {"log.cleaner.dedupe.buffer.size": "1000"},
        {"log.cleaner.threads": "2", "log.cleaner.dedupe.buffer.size": str(1024 * 1024)},
        {"log.cleaner.min.compaction.lag.ms": "10", "log.cleaner.max.compaction.lag.ms": "5"},
        {"log.cleanup.policy": "shred"},
        {"log.cleaner.enable": "maybe"},
        {"log.cleaner.cpu.max.share": "0"},
        {"log.cleaner.cpu.max.share": "1.5"},
        {"log.cleaner.cpu.max.share": "nan"},
    ],
)
def test_bad_log_cleaner_settings_are_refused(overrides: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        BrokerConfig.load(None, overrides)
