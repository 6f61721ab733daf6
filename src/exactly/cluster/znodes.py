"""Kafka's ZooKeeper layout: znode paths and the exact JSON of each znode (Kafka's ``ZkData``).

Why exact
---------
Kafka's own tools (``zookeeper-shell``, ``kafka-topics --zookeeper`` of old, ``zkCli``) and anyone
debugging a cluster read these znodes; keeping Kafka's formats byte-for-byte in meaning (field names,
versions, the places where Kafka writes numbers as strings) keeps that knowledge valid. Where Kafka
writes a number as a JSON string (broker ``timestamp``, PID ``block_start``/``block_end``) so do we,
and decoders accept both.

Everything here is pure: bytes in, frozen values out (or the reverse). A malformed znode raises
:class:`ZnodeFormatError`, never a bare ``KeyError``, so the shell can log it with its path.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# --- paths ------------------------------------------------------------------------------------

CONTROLLER = "/controller"
CONTROLLER_EPOCH = "/controller_epoch"
BROKERS = "/brokers"
BROKER_IDS = "/brokers/ids"
BROKER_TOPICS = "/brokers/topics"
BROKER_SEQID = "/brokers/seqid"
CONFIG = "/config"
CONFIG_CHANGES = "/config/changes"
CONFIG_TOPICS = "/config/topics"
CONFIG_BROKERS = "/config/brokers"
ADMIN_DELETE_TOPICS = "/admin/delete_topics"
ISR_CHANGE_NOTIFICATION = "/isr_change_notification"
LATEST_PRODUCER_ID_BLOCK = "/latest_producer_id_block"
LOG_DIR_EVENT_NOTIFICATION = "/log_dir_event_notification"
CLUSTER_ID = "/cluster/id"

# Kafka's ZkData.PersistentZkPaths: every broker creates the missing ones at start-up, so e.g.
# /latest_producer_id_block exists with empty data before the first block is taken.
PERSISTENT_PATHS = (
    "/consumers",
    BROKER_IDS,
    BROKER_TOPICS,
    CONFIG_CHANGES,
    ADMIN_DELETE_TOPICS,
    BROKER_SEQID,
    ISR_CHANGE_NOTIFICATION,
    LATEST_PRODUCER_ID_BLOCK,
    LOG_DIR_EVENT_NOTIFICATION,
    CONFIG_TOPICS,
    "/config/clients",
    "/config/users",
    CONFIG_BROKERS,
    "/config/ips",
)

NO_LEADER = -1  # LeaderAndIsr.NoLeader
# PRODUCER_ID_BLOCK_SIZE of Kafka's ProducerIdsBlock
PRODUCER_ID_BLOCK_SIZE = 1000


def broker_path(broker_id: int) -> str:
    return f"{BROKER_IDS}/{broker_id}"


def topic_path(topic: str) -> str:
    return f"{BROKER_TOPICS}/{topic}"


def partitions_path(topic: str) -> str:
    return f"{BROKER_TOPICS}/{topic}/partitions"


def partition_path(topic: str, partition: int) -> str:
    return f"{BROKER_TOPICS}/{topic}/partitions/{partition}"


def partition_state_path(topic: str, partition: int) -> str:
    return f"{BROKER_TOPICS}/{topic}/partitions/{partition}/state"


def topic_config_path(topic: str) -> str:
    return f"{CONFIG_TOPICS}/{topic}"


def delete_topic_path(topic: str) -> str:
    return f"{ADMIN_DELETE_TOPICS}/{topic}"


# --- helpers ----------------------------------------------------------------------------------


class ZnodeFormatError(ValueError):
    """A znode's data does not follow Kafka's format."""


def _encode(obj: Mapping[str, Any]) -> bytes:
    # Kafka's Json.encodeAsBytes: compact, no spaces.
    return json.dumps(obj, separators=(",", ":")).encode()


def _decode_object(data: bytes | None, what: str) -> dict[str, Any]:
    if not data:
        raise ZnodeFormatError(f"{what}: empty znode")
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ZnodeFormatError(f"{what}: not JSON: {data[:80]!r}") from exc
    if not isinstance(obj, dict):
        raise ZnodeFormatError(f"{what}: not a JSON object")
    return obj


def _int(obj: Mapping[str, Any], key: str, what: str) -> int:
    """An int field; Kafka writes some as strings ("timestamp", "block_start"), accept both."""
    value = obj.get(key)
    if isinstance(value, bool):
        raise ZnodeFormatError(f"{what}: {key} is not an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    raise ZnodeFormatError(f"{what}: {key} missing or not an integer: {value!r}")


def _int_list(value: object, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ZnodeFormatError(f"{what}: expected a list of integers, got {value!r}")
    return tuple(value)


# --- /brokers/ids/<id> ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One advertised listener, written as ``LISTENER://host:port``."""

    listener: str
    host: str
    port: int
    security_protocol: str = "PLAINTEXT"

    @property
    def connection_string(self) -> str:
        return f"{self.listener}://{self.host}:{self.port}"

    @classmethod
    def parse(cls, text: str, protocol_map: Mapping[str, str] | None = None) -> Endpoint:
        listener, sep, rest = text.partition("://")
        host, colon, port = rest.rpartition(":")
        if not sep or not colon or not listener:
            raise ZnodeFormatError(f"endpoint {text!r} is not LISTENER://host:port")
        try:
            port_number = int(port)
        except ValueError as exc:
            raise ZnodeFormatError(f"endpoint {text!r}: bad port") from exc
        protocol = (protocol_map or {}).get(listener, listener)
        return cls(listener, host.strip("[]"), port_number, protocol)


BROKER_REGISTRATION_VERSION = 5


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    """The data of the ephemeral ``/brokers/ids/<id>`` (version 5, Kafka IBP >= 2.7).

    ``host``/``port`` at the top level are the first PLAINTEXT endpoint (for old clients); without
    one Kafka writes host null and port -1.
    """

    broker_id: int
    endpoints: tuple[Endpoint, ...]
    rack: str | None = None
    jmx_port: int = -1
    timestamp_ms: int = 0
    features: Mapping[str, Any] = field(default_factory=dict)

    def encode(self) -> bytes:
        plaintext = next((e for e in self.endpoints if e.security_protocol == "PLAINTEXT"), None)
        obj: dict[str, Any] = {
            "version": BROKER_REGISTRATION_VERSION,
            "host": plaintext.host if plaintext else None,
            "port": plaintext.port if plaintext else -1,
            "endpoints": [e.connection_string for e in self.endpoints],
            "jmx_port": self.jmx_port,
            "timestamp": str(self.timestamp_ms),
            "listener_security_protocol_map": {e.listener: e.security_protocol for e in self.endpoints},
            "features": dict(self.features),
        }
        if self.rack is not None:
            obj["rack"] = self.rack
        return _encode(obj)

    @classmethod
    def decode(cls, broker_id: int, data: bytes | None) -> BrokerRegistration:
        what = f"broker {broker_id} registration"
        obj = _decode_object(data, what)
        protocol_map = obj.get("listener_security_protocol_map") or {}
        raw_endpoints = obj.get("endpoints")
        if not isinstance(raw_endpoints, list) or not isinstance(protocol_map, dict):
            raise ZnodeFormatError(f"{what}: endpoints missing")
        endpoints = tuple(Endpoint.parse(str(e), protocol_map) for e in raw_endpoints)
        rack = obj.get("rack")
        features = obj.get("features") or {}
        return cls(
            broker_id=broker_id,
            endpoints=endpoints,
            rack=rack if isinstance(rack, str) else None,
            jmx_port=_int(obj, "jmx_port", what) if "jmx_port" in obj else -1,
            timestamp_ms=_int(obj, "timestamp", what) if "timestamp" in obj else 0,
            features=features if isinstance(features, dict) else {},
        )


# --- /controller and /controller_epoch --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ControllerRegistration:
    """``/controller``: who won the election. Kafka 3.4 writes version 2 with
    ``kraftControllerEpoch: -1`` (ZK mode); version 1 (no such field) is accepted on read."""

    broker_id: int
    timestamp_ms: int = 0

    def encode(self) -> bytes:
        return _encode(
            {
                "version": 2,
                "brokerid": self.broker_id,
                "timestamp": str(self.timestamp_ms),
                "kraftControllerEpoch": -1,
            }
        )

    @classmethod
    def decode(cls, data: bytes | None) -> ControllerRegistration:
        obj = _decode_object(data, "controller")
        timestamp = _int(obj, "timestamp", "controller") if "timestamp" in obj else 0
        return cls(_int(obj, "brokerid", "controller"), timestamp)


def encode_controller_epoch(epoch: int) -> bytes:
    """``/controller_epoch`` holds the epoch as a plain ASCII integer, not JSON."""
    return str(epoch).encode()


def decode_controller_epoch(data: bytes | None) -> int:
    try:
        return int((data or b"").decode().strip())
    except (UnicodeDecodeError, ValueError) as exc:
        raise ZnodeFormatError(f"controller_epoch: not an integer: {data!r}") from exc


# --- /brokers/topics/<t> ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TopicAssignment:
    """``/brokers/topics/<t>`` version 3: replicas per partition (order = preference), the
    reassignment sets, and the topic id (a Kafka UUID string, base64url without padding)."""

    partitions: Mapping[int, tuple[int, ...]]
    topic_id: str | None = None
    adding_replicas: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    removing_replicas: Mapping[int, tuple[int, ...]] = field(default_factory=dict)

    def encode(self) -> bytes:
        obj: dict[str, Any] = {
            "version": 3,
            "partitions": {str(p): list(r) for p, r in sorted(self.partitions.items())},
            "adding_replicas": {str(p): list(r) for p, r in sorted(self.adding_replicas.items()) if r},
            "removing_replicas": {str(p): list(r) for p, r in sorted(self.removing_replicas.items()) if r},
        }
        if self.topic_id is not None:
            obj["topic_id"] = self.topic_id
        return _encode(obj)

    @classmethod
    def decode(cls, topic: str, data: bytes | None) -> TopicAssignment:
        what = f"topic {topic} assignment"
        obj = _decode_object(data, what)

        def replica_map(key: str) -> dict[int, tuple[int, ...]]:
            raw = obj.get(key) or {}
            if not isinstance(raw, dict):
                raise ZnodeFormatError(f"{what}: {key} is not an object")
            try:
                return {int(p): _int_list(r, what) for p, r in raw.items()}
            except ValueError as exc:
                raise ZnodeFormatError(f"{what}: bad partition id in {key}") from exc

        topic_id = obj.get("topic_id")
        return cls(
            partitions=replica_map("partitions"),
            topic_id=topic_id if isinstance(topic_id, str) else None,
            adding_replicas=replica_map("adding_replicas"),
            removing_replicas=replica_map("removing_replicas"),
        )


# --- /brokers/topics/<t>/partitions/<p>/state -------------------------------------------------

LEADER_RECOVERY_RECOVERED = 0
LEADER_RECOVERY_RECOVERING = 1


@dataclass(frozen=True, slots=True)
class LeaderAndIsr:
    """A partition's state znode (Kafka's ``LeaderAndIsr`` + the controller epoch that wrote it).

    The znode's stat version (zkVersion, the "partition epoch") is not part of the data; it travels
    next to this value (see :class:`PartitionState`).

    Invariants: the ISR is never empty (when the last member dies the controller writes leader -1
    and keeps that member); ``leader_epoch`` changes only by the controller, always +1.
    """

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int
    leader_recovery_state: int = LEADER_RECOVERY_RECOVERED

    def encode(self) -> bytes:
        obj: dict[str, Any] = {
            "version": 1,
            "leader": self.leader,
            "leader_epoch": self.leader_epoch,
            "isr": list(self.isr),
            "controller_epoch": self.controller_epoch,
        }
        # Kafka writes the field only while RECOVERING (3.2+), keeping the znode readable by old tools.
        if self.leader_recovery_state != LEADER_RECOVERY_RECOVERED:
            obj["leader_recovery_state"] = self.leader_recovery_state
        return _encode(obj)

    @classmethod
    def decode(cls, data: bytes | None, what: str = "partition state") -> LeaderAndIsr:
        obj = _decode_object(data, what)
        recovery = obj.get("leader_recovery_state", LEADER_RECOVERY_RECOVERED)
        if recovery not in (LEADER_RECOVERY_RECOVERED, LEADER_RECOVERY_RECOVERING):
            raise ZnodeFormatError(f"{what}: leader_recovery_state {recovery!r}")
        return cls(
            leader=_int(obj, "leader", what),
            leader_epoch=_int(obj, "leader_epoch", what),
            isr=_int_list(obj.get("isr"), what),
            controller_epoch=_int(obj, "controller_epoch", what),
            leader_recovery_state=int(recovery),
        )

    def new_leader_and_isr(self, leader: int, isr: tuple[int, ...], controller_epoch: int) -> LeaderAndIsr:
        """Kafka's ``newLeaderAndIsr``: every controller decision bumps the leader epoch by one."""
        return LeaderAndIsr(leader, self.leader_epoch + 1, isr, controller_epoch, self.leader_recovery_state)


@dataclass(frozen=True, slots=True)
class PartitionState:
    """A state znode as read: its data plus its stat version, which conditional writes check."""

    leader_and_isr: LeaderAndIsr
    zk_version: int


# --- /latest_producer_id_block ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProducerIdBlock:
    """A block of producer ids ``[block_start, block_end]`` (inclusive, as Kafka) taken by ``broker``."""

    broker: int
    block_start: int
    block_end: int

    @property
    def size(self) -> int:
        return self.block_end - self.block_start + 1

    def encode(self) -> bytes:
        # Start and end are JSON strings in Kafka's format.
        return _encode(
            {
                "version": 1,
                "broker": self.broker,
                "block_start": str(self.block_start),
                "block_end": str(self.block_end),
            }
        )

    @classmethod
    def decode(cls, data: bytes | None) -> ProducerIdBlock | None:
        """None for the empty znode every broker creates at start-up (no block taken yet)."""
        if not data:
            return None
        what = "latest_producer_id_block"
        obj = _decode_object(data, what)
        return cls(_int(obj, "broker", what), _int(obj, "block_start", what), _int(obj, "block_end", what))


MAX_PRODUCER_ID = 2**63 - 1


def next_producer_id_block(
    latest: ProducerIdBlock | None, broker: int, size: int = PRODUCER_ID_BLOCK_SIZE
) -> ProducerIdBlock:
    """The block after ``latest`` (``[0, size-1]`` when none was taken). Raises on long overflow,
    which Kafka treats as fatal: ids must never wrap around."""
    start = 0 if latest is None else latest.block_end + 1
    end = start + size - 1
    if end > MAX_PRODUCER_ID or start < 0:
        raise ZnodeFormatError(f"producer id space exhausted after {latest}")
    return ProducerIdBlock(broker, start, end)


# --- /config/topics/<t> -----------------------------------------------------------------------


def encode_topic_config(config: Mapping[str, str]) -> bytes:
    return _encode({"version": 1, "config": dict(sorted(config.items()))})


def decode_topic_config(data: bytes | None) -> dict[str, str]:
    if not data:
        return {}
    obj = _decode_object(data, "topic config")
    config = obj.get("config") or {}
    if not isinstance(config, dict):
        raise ZnodeFormatError("topic config: config is not an object")
    return {str(k): str(v) for k, v in config.items()}


def encode_topic_id(topic_id: uuid.UUID) -> str:
    """Kafka's ``Uuid.toString``: the 16 bytes in URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(topic_id.bytes).decode().rstrip("=")


def decode_topic_id(text: str) -> uuid.UUID:
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise ZnodeFormatError(f"topic id {text!r} is not base64url") from exc
    if len(raw) != 16:
        raise ZnodeFormatError(f"topic id {text!r} is not 16 bytes")
    return uuid.UUID(bytes=raw)


def encode_cluster_id(cluster_id: str) -> bytes:
    """``/cluster/id``: Kafka's ClusterIdZNode, ``{"version":"1","id":"..."}`` (version a string)."""
    return _encode({"version": "1", "id": cluster_id})


def decode_cluster_id(data: bytes | None) -> str:
    obj = _decode_object(data, "cluster id")
    value = obj.get("id")
    if not isinstance(value, str) or not value:
        raise ZnodeFormatError("cluster id: id missing")
    return value
