"""A local replicated cluster on loopback: one ZooKeeper and N broker processes.

``exactly cluster`` runs it until Ctrl-C; ``exactly pipeline demo --cluster N`` runs the orders
pipeline on it and may kill -9 one broker mid-run (``BrokerCrash``). The brokers are real
``exactly serve`` subprocesses (``exactly.testing.broker``, the project's one launcher), so a
SIGKILL of one of them is a real broker failure: its partitions move to other replicas once
ZooKeeper drops its registration (``zookeeper.session.timeout.ms``), and it rejoins the ISRs
after its restart.

Configuration (``internal_topic_defaults``, ``replicated_defaults``):

* the coordinators' internal topics get Kafka's replication (``offsets.topic.replication.factor``
  and ``transaction.state.log.replication.factor`` 3, ``transaction.state.log.min.isr`` 2),
  capped at the number of brokers, as Kafka's sample configs do for smaller clusters;
* for the pipeline, topics created with the broker default (replication factor -1, as the
  pipeline's ``create_topics`` and the sink's progress topic do) get ``default.replication.factor``
  3 and ``min.insync.replicas`` 2: an acks=all write survives the loss of one broker and is never
  acknowledged by only one.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from exactly.client.cluster_status import ClusterStatus, read_status
from exactly.client.wire import WireError
from exactly.cluster.zookeeper import ZooKeeperServer
from exactly.testing.broker import Broker

START_TIMEOUT_S = 60.0
TRANSACTION_STATE_TOPIC = "__transaction_state"


def internal_topic_defaults(brokers: int) -> dict[str, str]:
    """Kafka refuses to create the coordinators' internal topics with fewer live brokers than
    their replication factor (3); a smaller development cluster gets factors it can satisfy."""
    return {
        "offsets.topic.replication.factor": str(min(3, brokers)),
        "transaction.state.log.replication.factor": str(min(3, brokers)),
        "transaction.state.log.min.isr": str(min(2, brokers)),
    }


def replicated_defaults(brokers: int) -> dict[str, str]:
    """``internal_topic_defaults`` plus RF 3 / min ISR 2 for topics created with RF -1."""
    return {
        **internal_topic_defaults(brokers),
        "default.replication.factor": str(min(3, brokers)),
        "min.insync.replicas": str(min(2, brokers)),
    }


class LocalCluster:
    """ZooKeeper (``D/zookeeper``) and brokers ``D/broker-<id>`` (ids 0..N-1, logs in
    ``D/broker-<id>.log``) on the chroot ``/exactly``. ``start`` returns once every broker
    listens; ``close`` stops the brokers (SIGTERM: controlled shutdowns) and then ZooKeeper."""

    def __init__(self, data_dir: Path, brokers: int, overrides: Mapping[str, str], zookeeper_port: int = 0):
        self.data_dir = data_dir.resolve()
        self.count = brokers
        self.overrides = dict(overrides)
        (self.data_dir / "zookeeper").mkdir(parents=True, exist_ok=True)
        self.zookeeper = ZooKeeperServer(self.data_dir / "zookeeper", zookeeper_port)
        self.brokers: list[Broker] = []
        self.connect = ""

    def start(self) -> LocalCluster:
        """Raises ``ZooKeeperError`` / ``BrokerError`` (the caller reports them)."""
        address = self.zookeeper.start()
        self.connect = f"{address.connect}/exactly"
        self.brokers = [
            Broker(
                self.data_dir / f"broker-{broker_id}",
                self.data_dir / f"broker-{broker_id}.log",
                overrides={**self.overrides, "broker.id": str(broker_id), "zookeeper.connect": self.connect},
                name=f"broker-{broker_id}",
            )
            for broker_id in range(self.count)
        ]
        for broker in self.brokers:
            broker.start(timeout=START_TIMEOUT_S)
        return self

    @property
    def bootstrap(self) -> str:
        """Every broker's address (including stopped ones: clients skip those and retry)."""
        return ",".join(f"{b.host}:{b.port}" for b in self.brokers if b.port is not None)

    def broker(self, broker_id: int) -> Broker:
        return self.brokers[broker_id]

    def close(self) -> None:
        for broker in self.brokers:
            broker.close()  # SIGTERM, then SIGKILL if it hangs
        self.zookeeper.stop()


# ---------------------------------------------------------------------------- a crash mid-run
@dataclass(frozen=True)
class Victim:
    """The broker to crash and why it was chosen."""

    broker_id: int
    roles: tuple[str, ...]

    def describe(self) -> str:
        return f"broker {self.broker_id} ({', '.join(self.roles) or 'no leaderships'})"


def choose_victim(status: ClusterStatus, outputs: Sequence[str]) -> Victim:
    """The broker whose loss hurts an exactly-once writer most: the transaction coordinator of
    the most transactional ids (the leader of the most ``__transaction_state`` partitions: every
    commit in flight there meets the failover), then the one leading the most output partitions,
    ties broken by the lowest id. Its roles are listed (coordinator partitions counted)."""
    coordinating: dict[int, int] = {b.broker_id: 0 for b in status.brokers}
    leading: dict[int, list[str]] = {b.broker_id: [] for b in status.brokers}
    if not coordinating:
        raise WireError("no live broker in the metadata")
    log_partitions = 0
    for p in status.partitions:
        log_partitions += p.topic == TRANSACTION_STATE_TOPIC
        if p.leader not in coordinating:
            continue
        if p.topic == TRANSACTION_STATE_TOPIC:
            coordinating[p.leader] += 1
        elif p.topic in outputs:
            leading[p.leader].append(f"{p.topic}-{p.partition}")
    chosen = max(sorted(coordinating), key=lambda b: (coordinating[b], len(leading[b])))
    roles = []
    if coordinating[chosen]:
        roles.append(
            f"transaction coordinator of {coordinating[chosen]}/{log_partitions} {TRANSACTION_STATE_TOPIC} partitions"
        )
    if leading[chosen]:
        roles.append(f"leader of {', '.join(leading[chosen])}")
    if status.controller_id == chosen:
        roles.append("controller")
    return Victim(chosen, tuple(roles))


def live_broker_ids(bootstrap: str) -> set[int] | None:
    """The brokers the cluster's metadata lists as alive, or None if no broker answered."""
    try:
        return {b.broker_id for b in read_status(bootstrap, timeout_s=5).brokers}
    except WireError:
        return None


def restart_after_deregistration(cluster: LocalCluster, broker_id: int, timeout: float = 120.0) -> None:
    """Restart a killed broker on its old port once the others no longer list it (ZooKeeper
    expired its session: a broker re-registering under a live ephemeral znode is refused)."""
    broker = cluster.broker(broker_id)
    others = ",".join(f"{b.host}:{b.port}" for b in cluster.brokers if b.running)
    deadline = time.monotonic() + timeout
    while True:
        live = live_broker_ids(others)
        if live is not None and broker_id not in live:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"broker {broker_id} still registered {timeout:.0f}s after its kill")
        time.sleep(0.2)
    broker.start(port=broker.port or 0, timeout=START_TIMEOUT_S)
