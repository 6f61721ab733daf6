"""Broker configuration under Kafka's names and defaults.

Users bring their Kafka knowledge: ``-o num.partitions=3`` or a ``server.properties``-style file
mean what they mean in Kafka. Unknown names are refused at start-up (a typo should not silently
fall back to a default).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from exactly.security.authorizer import authorizer_from_config
from exactly.security.inter_broker import InterBrokerConfigError, InterBrokerSecurity, inter_broker_security
from exactly.security.listeners import ListenerError, Listeners, parse_listeners
from exactly.storage.cleaner.runner import DEFAULT_CPU_SHARE, CleanerConfig
from exactly.storage.config import InvalidConfigError, LogConfig

_DEFAULTS: dict[str, str] = {
    "node.id": "0",
    "broker.id": "",
    "zookeeper.connect": "",
    "zookeeper.session.timeout.ms": "18000",
    "zookeeper.connection.timeout.ms": "",
    "replica.lag.time.max.ms": "30000",
    "replica.high.watermark.checkpoint.interval.ms": "5000",
    "replica.socket.timeout.ms": "30000",
    "unclean.leader.election.enable": "false",
    "controlled.shutdown.enable": "true",
    "controlled.shutdown.max.retries": "3",
    "controlled.shutdown.retry.backoff.ms": "5000",
    "auto.leader.rebalance.enable": "true",
    "leader.imbalance.check.interval.seconds": "300",
    "leader.imbalance.per.broker.percentage": "10",
    "listeners": "PLAINTEXT://127.0.0.1:9092",
    "advertised.listeners": "",
    # Security (Kafka's names): listeners, TLS (PEM only), SASL. Per-listener values use the
    # listener.name.<lower-case listener>.<key> prefix (see _LISTENER_KEYS).
    "listener.security.protocol.map": "",
    "inter.broker.listener.name": "",
    "security.inter.broker.protocol": "",  # PLAINTEXT when neither it nor the name is set
    "sasl.mechanism.inter.broker.protocol": "",  # Kafka's default GSSAPI is not supported
    "sasl.jaas.config": "",  # the fallback of listener.name.<l>.<mechanism>.sasl.jaas.config
    "ssl.keystore.type": "PEM",
    "ssl.keystore.location": "",
    "ssl.keystore.password": "",
    "ssl.keystore.certificate.chain": "",
    "ssl.keystore.key": "",
    "ssl.key.password": "",
    "ssl.truststore.type": "PEM",
    "ssl.truststore.location": "",
    "ssl.truststore.password": "",
    "ssl.truststore.certificates": "",
    "ssl.client.auth": "none",
    "ssl.enabled.protocols": "TLSv1.2,TLSv1.3",
    "ssl.protocol": "TLSv1.3",
    "ssl.cipher.suites": "",
    "ssl.endpoint.identification.algorithm": "https",
    "ssl.principal.mapping.rules": "DEFAULT",
    # Kafka's default is GSSAPI, which exactly does not support
    "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",
    "sasl.server.max.receive.size": "524288",
    "connection.failed.authentication.delay.ms": "100",
    "log.dirs": "./data",
    "num.partitions": "1",
    "default.replication.factor": "1",
    "auto.create.topics.enable": "true",
    "delete.topic.enable": "true",
    "message.max.bytes": "1048588",
    "socket.request.max.bytes": "104857600",
    "log.segment.bytes": "1073741824",
    "log.roll.ms": "",
    "log.roll.hours": "168",
    "log.index.size.max.bytes": "10485760",
    "log.index.interval.bytes": "4096",
    "log.retention.bytes": "-1",
    "log.retention.ms": "",
    "log.retention.minutes": "",
    "log.retention.hours": "168",
    "log.retention.check.interval.ms": "300000",
    "log.flush.interval.messages": str(2**63 - 1),
    "log.flush.interval.ms": "",
    "log.flush.scheduler.interval.ms": str(2**63 - 1),
    "log.message.timestamp.type": "CreateTime",
    "log.cleanup.policy": "delete",
    # The log cleaner (cleanup.policy=compact): Kafka's names and defaults.
    "log.cleaner.enable": "true",
    "log.cleaner.threads": "1",
    "log.cleaner.dedupe.buffer.size": "134217728",
    "log.cleaner.io.buffer.size": "524288",
    "log.cleaner.io.buffer.load.factor": "0.9",
    "log.cleaner.backoff.ms": "15000",
    "log.cleaner.io.max.bytes.per.second": "1.7976931348623157E308",
    # exactly's own (Kafka's cleaner is not CPU-limited): each cleaner worker's CPU as a share of
    # one core, in (0, 1]; 1.0 is Kafka's behaviour. See storage.cleaner.duty_cycle.
    "log.cleaner.cpu.max.share": str(DEFAULT_CPU_SHARE),
    "log.cleaner.min.cleanable.ratio": "0.5",
    "log.cleaner.min.compaction.lag.ms": "0",
    "log.cleaner.max.compaction.lag.ms": str(2**63 - 1),
    "log.cleaner.delete.retention.ms": "86400000",
    "min.insync.replicas": "1",
    "producer.id.expiration.ms": "86400000",
    "producer.id.expiration.check.interval.ms": "600000",
    "transaction.max.timeout.ms": "900000",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "10000",
    "transaction.remove.expired.transaction.cleanup.interval.ms": "3600000",
    "transactional.id.expiration.ms": "604800000",
    "transaction.two.phase.commit.enable": "false",  # KIP-939 (Kafka 4.1), off by default as in Kafka
    "transaction.partition.verification.enable": "true",  # KIP-890 part 1 (Kafka 3.6+)
    "transaction.state.log.num.partitions": "50",
    "transaction.state.log.segment.bytes": "104857600",
    "transaction.state.log.replication.factor": "3",  # cluster mode only; a single broker uses 1
    "transaction.state.log.min.isr": "2",  # cluster mode only
    "offsets.topic.num.partitions": "50",
    "offsets.topic.segment.bytes": "104857600",
    "offsets.topic.replication.factor": "3",  # cluster mode only; a single broker uses 1
    "offsets.commit.timeout.ms": "5000",  # cluster mode: how long a coordinator write waits for the ISR
    "offsets.retention.minutes": "10080",
    "offsets.retention.check.interval.ms": "600000",
    "group.initial.rebalance.delay.ms": "3000",
    "group.min.session.timeout.ms": "6000",
    "group.max.session.timeout.ms": "1800000",
    "connections.max.idle.ms": "600000",
    "metrics.port": "",
    # Authorization (exactly.security): off unless authorizer.class.name names an ACL authorizer.
    "authorizer.class.name": "",
    "super.users": "",
    "allow.everyone.if.no.acl.found": "false",
}


class ConfigError(ValueError):
    pass


# Keys that may also be given per listener as listener.name.<listener>.<key>, plus the PLAIN
# JAAS configuration (listener.name.<listener>.plain.sasl.jaas.config), Kafka's per-mechanism form.
_LISTENER_KEYS = frozenset(
    k
    for k in _DEFAULTS
    if k.startswith(("ssl.", "sasl."))
    and k not in ("sasl.mechanism.inter.broker.protocol", "sasl.jaas.config")
) | {
    "plain.sasl.jaas.config",
    "scram-sha-256.sasl.jaas.config",
    "scram-sha-512.sasl.jaas.config",
}


def _known(name: str) -> bool:
    if name in _DEFAULTS:
        return True
    if name.startswith("listener.name."):
        parts = name[len("listener.name.") :].split(".", 1)
        return len(parts) == 2 and bool(parts[0]) and parts[1] in _LISTENER_KEYS
    return False


def parse_properties(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        sep = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if sep < 0:
            raise ConfigError(f"bad config line (expected key=value): {raw!r}")
        out[line[:sep].strip()] = line[sep + 1 :].strip()
    return out


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """The broker's settings, immutable once loaded.

    Owns ``values``: every known name mapped to its string value (Kafka's default unless the
    properties file or an override gave one). Lifecycle: ``load`` (refuses unknown names and
    values the log layer cannot parse) at start-up, then read-only for the process's life; the
    typed getters parse on each call, so callers that are on a hot path read a value once and
    keep it (the Broker does for the request size limit and topic defaults)."""

    values: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path | None, overrides: Mapping[str, str]) -> BrokerConfig:
        values = dict(_DEFAULTS)
        given: dict[str, str] = {}
        if path is not None:
            given.update(parse_properties(path.read_text()))
        given.update(overrides)
        unknown = sorted(k for k in given if not _known(k))
        if unknown:
            raise ConfigError(f"unknown broker config(s): {', '.join(unknown)}")
        values.update(given)
        config = cls(values)
        config.log_config()  # validate numbers early
        config.cleaner_config()
        config.validate_cluster()
        try:
            authorizer_from_config(values)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        config.listeners()
        return config

    def get(self, name: str) -> str:
        return self.values[name]

    def get_int(self, name: str) -> int:
        raw = self.values[name]
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"{name} must be an integer, got {raw!r}") from None

    def get_float(self, name: str) -> float:
        raw = self.values[name]
        try:
            return float(raw)
        except ValueError:
            raise ConfigError(f"{name} must be a number, got {raw!r}") from None

    def get_bool(self, name: str) -> bool:
        raw = self.values[name].lower()
        if raw not in ("true", "false"):
            raise ConfigError(f"{name} must be true or false, got {raw!r}")
        return raw == "true"

    @property
    def node_id(self) -> int:
        """``broker.id`` (ZooKeeper mode's name) when given, else ``node.id``."""
        if self.values["broker.id"]:
            return self.get_int("broker.id")
        return self.get_int("node.id")

    def metrics_port(self) -> int | None:
        """``metrics.port`` (the Prometheus endpoint): None when unset (no endpoint), else
        0-65535 (0 = any free port)."""
        raw = self.values["metrics.port"].strip()
        if not raw:
            return None
        try:
            port = int(raw)
        except ValueError:
            raise ConfigError(f"metrics.port must be a port number, got {raw!r}") from None
        if not 0 <= port <= 65535:
            raise ConfigError(f"metrics.port must be between 0 and 65535, got {port}")
        return port

    @property
    def cluster_mode(self) -> bool:
        """A replicated cluster coordinated by ZooKeeper: ``zookeeper.connect`` is set."""
        return bool(self.values["zookeeper.connect"].strip())

    def validate_cluster(self) -> None:
        """Refuse combinations Kafka refuses: two different ids, a negative id in cluster mode
        (no broker.id generation here), a non-positive session timeout, a replication factor
        above 1 without a cluster."""
        if (
            self.values["broker.id"]
            and self.values["node.id"] != _DEFAULTS["node.id"]
            and self.get_int("broker.id") != self.get_int("node.id")
        ):
            raise ConfigError("broker.id and node.id differ; set one of them")
        if self.cluster_mode:
            if self.node_id < 0:
                raise ConfigError("broker.id must be >= 0 with zookeeper.connect")
            if self.get_int("zookeeper.session.timeout.ms") <= 0:
                raise ConfigError("zookeeper.session.timeout.ms must be positive")
            if self.get_int("replica.lag.time.max.ms") <= 0:
                raise ConfigError("replica.lag.time.max.ms must be positive")
            if self.get_int("replica.high.watermark.checkpoint.interval.ms") <= 0:
                raise ConfigError("replica.high.watermark.checkpoint.interval.ms must be positive")

            if self.get_int("replica.socket.timeout.ms") <= 0:
                raise ConfigError("replica.socket.timeout.ms must be positive")
            self.get_bool("unclean.leader.election.enable")
            self.get_bool("controlled.shutdown.enable")
            self.get_bool("auto.leader.rebalance.enable")
            if self.get_int("leader.imbalance.check.interval.seconds") <= 0:
                raise ConfigError("leader.imbalance.check.interval.seconds must be positive")
            for name in (
                "controlled.shutdown.max.retries",
                "controlled.shutdown.retry.backoff.ms",
                "leader.imbalance.per.broker.percentage",
            ):
                if self.get_int(name) < 0:
                    raise ConfigError(f"{name} must not be negative")
        elif self.get_int("default.replication.factor") != 1:
            raise ConfigError("default.replication.factor above 1 needs zookeeper.connect (a cluster)")

    def listeners(self) -> Listeners:
        """``listeners``/``advertised.listeners`` with their protocols; in cluster mode the
        inter-broker listener must exist, be advertised, and have what its protocol needs on the
        connecting side (``inter_broker_security``)."""
        v = self.values
        try:
            parsed = parse_listeners(
                v["listeners"],
                v["advertised.listeners"],
                v["listener.security.protocol.map"],
                v["inter.broker.listener.name"],
                v["security.inter.broker.protocol"],
            )
        except ListenerError as exc:
            raise ConfigError(str(exc)) from None
        if self.cluster_mode:
            self.inter_broker_security(parsed)
        return parsed

    def inter_broker_security(self, parsed: Listeners | None = None) -> InterBrokerSecurity:
        """How this broker connects to the others (cluster mode): the inter-broker listener's
        protocol, TLS client settings and SASL credentials; ConfigError when they cannot work."""
        parsed = parsed if parsed is not None else self.listeners()
        try:
            inter = parsed.spec(parsed.inter_broker)
        except KeyError:
            raise ConfigError(
                f"inter-broker listener {parsed.inter_broker} is not one of the listeners "
                "(set inter.broker.listener.name)"
            ) from None
        if parsed.advertised_spec(inter.name) is None:
            raise ConfigError(f"inter-broker listener {inter.name} is not advertised")
        try:
            return inter_broker_security(self.values, inter)
        except InterBrokerConfigError as exc:
            raise ConfigError(str(exc)) from None

    def retention_ms(self) -> int:
        if self.values["log.retention.ms"]:
            return self.get_int("log.retention.ms")
        if self.values["log.retention.minutes"]:
            return self.get_int("log.retention.minutes") * 60_000
        return self.get_int("log.retention.hours") * 3_600_000

    def flush_ms(self) -> int:
        if self.values["log.flush.interval.ms"]:
            return self.get_int("log.flush.interval.ms")
        return self.get_int("log.flush.scheduler.interval.ms")

    def log_config(self) -> LogConfig:
        """Topic defaults derived from the broker's log.* settings (as Kafka's LogConfig)."""
        roll_ms = (
            self.get_int("log.roll.ms")
            if self.values["log.roll.ms"]
            else self.get_int("log.roll.hours") * 3_600_000
        )
        defaults = LogConfig(
            segment_bytes=self.get_int("log.segment.bytes"),
            segment_ms=roll_ms,
            segment_index_bytes=self.get_int("log.index.size.max.bytes"),
            index_interval_bytes=self.get_int("log.index.interval.bytes"),
            retention_bytes=self.get_int("log.retention.bytes"),
            retention_ms=self.retention_ms(),
            flush_messages=self.get_int("log.flush.interval.messages"),
            flush_ms=self.flush_ms(),
            max_message_bytes=self.get_int("message.max.bytes"),
            message_timestamp_type=self.get("log.message.timestamp.type"),
            min_insync_replicas=self.get_int("min.insync.replicas"),
            unclean_leader_election_enable=str(self.get_bool("unclean.leader.election.enable")).lower(),
        )
        try:
            return defaults.with_overrides(
                {
                    # Through the topic-config parser, so the broker-level forms are validated alike.
                    "cleanup.policy": self.get("log.cleanup.policy"),
                    "min.cleanable.dirty.ratio": self.get("log.cleaner.min.cleanable.ratio"),
                    "min.compaction.lag.ms": self.get("log.cleaner.min.compaction.lag.ms"),
                    "max.compaction.lag.ms": self.get("log.cleaner.max.compaction.lag.ms"),
                    "delete.retention.ms": self.get("log.cleaner.delete.retention.ms"),
                }
            )
        except InvalidConfigError as exc:
            raise ConfigError(str(exc)) from None

    def cleaner_config(self) -> CleanerConfig:
        """The log cleaner's broker-level settings (``log.cleaner.*``)."""
        config = CleanerConfig(
            enable=self.get_bool("log.cleaner.enable"),
            num_threads=self.get_int("log.cleaner.threads"),
            dedupe_buffer_size=self.get_int("log.cleaner.dedupe.buffer.size"),
            io_buffer_size=self.get_int("log.cleaner.io.buffer.size"),
            io_buffer_load_factor=self.get_float("log.cleaner.io.buffer.load.factor"),
            backoff_ms=self.get_int("log.cleaner.backoff.ms"),
            max_io_bytes_per_second=self.get_float("log.cleaner.io.max.bytes.per.second"),
            max_cpu_share=self.get_float("log.cleaner.cpu.max.share"),
        )
        if config.num_threads < 0:
            raise ConfigError("log.cleaner.threads must not be negative")
        if config.map_memory_per_thread < 1024 * 1024:
            raise ConfigError("log.cleaner.dedupe.buffer.size must give each cleaner thread at least 1 MiB")
        if not 0 < config.max_cpu_share <= 1:
            raise ConfigError("log.cleaner.cpu.max.share must be in (0, 1] (a share of one core)")
        if not 0 < config.io_buffer_load_factor <= 1:
            raise ConfigError("log.cleaner.io.buffer.load.factor must be in (0, 1]")
        if config.backoff_ms < 0 or config.io_buffer_size <= 0 or config.max_io_bytes_per_second <= 0:
            raise ConfigError(
                "log.cleaner.backoff.ms, io.buffer.size and io.max.bytes.per.second must be positive"
            )
        return config
