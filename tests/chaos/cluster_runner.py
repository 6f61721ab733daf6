"""The chaos round on a three-broker cluster: ``run_cluster(ChaosConfig(...), zk_connect)``.

Same clients, history and checker as the single-broker round (``tests/chaos/runner.py``); what
changes is the system under test and the faults. Set-up: the caller's ZooKeeper (one per run of
``tests.chaos.run --cluster``, a chroot per seed), ``brokers`` brokers, the data topic with RF 3
and ``min.insync.replicas`` 2, the internal topics replicated (RF 3, transaction log min ISR 2,
created on first use), one partition each so every coordinator move is a whole move.

Every broker sits behind its own fault proxy and advertises the proxy's address, so clients
*and the other brokers* (follower fetches, WriteTxnMarkers, the controller's requests) reach it
only through the proxy. The broker's own outbound connections go through the *other* brokers'
proxies. A per-pair cut would need a proxy per (source, destination) pair and a per-peer
advertised address, which one advertised listener per broker cannot express; so "isolate"
blackholes one broker's proxy: nobody reaches it (clients, followers, the controller), while its
ZooKeeper session and its own fetches from the other leaders keep working - the asymmetric
partition in which a leader loses its followers but keeps its ZooKeeper registration.

Faults (one at a time, each healed before the next; weights in ``CLUSTER_FAULTS``):
  kill9      a random broker SIGKILLed, restarted on the same data dir and port
  bounce     a random broker SIGTERMed (controlled shutdown) and restarted
  stop_leader  the leader of a random data partition SIGSTOPped past
             ``zookeeper.session.timeout.ms`` (its session expires, a new leader is elected,
             the old one must step down and truncate when it resumes), then SIGCONT
  crash_prepare  the preferred leader of ``__transaction_state-0`` restarted with
             ``EXACTLY_FAULT=crash-after-prepare``; the auto leader rebalance hands it the
             coordinator back, it SIGKILLs itself once a PrepareCommit/PrepareAbort is replicated,
             before markers; the newly elected coordinator must finish the transaction
  kill_coordinator  the current transaction coordinator's broker SIGKILLed and restarted
  isolate    one broker's proxy blackholed for 2-6 s (see above)
  drop / cut  a broker's proxy drops responses / closes every connection
  pause / kill_client  as in the single-broker round

At the end: heal, wait until every partition (data and internal) has a leader and the full ISR
in ZooKeeper, let open transactions end, read everything back, check the history, and check the
replicas are byte-identical (``exactly.client.replica_verification``): a difference is reported
as the ``replica_divergence`` anomaly.
"""

from __future__ import annotations

import random
import shutil
import signal
import time
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from kazoo.exceptions import KazooException

from exactly.client.replica_verification import describe, verify_replicas
from exactly.client.wire import WireError
from exactly.cluster.zk import ClusterZk
from exactly.types import TopicPartition
from tests.chaos.history import HistoryWriter
from tests.chaos.runner import FAULT_ENV, Chaos, ChaosConfig, Client, Reachable, RunResult, run_chaos
from tests.cluster.helpers import await_registered, cluster_overrides
from tests.support.broker import Broker
from tests.support.proxy import FaultProxy, ProxiedBroker

SESSION_TIMEOUT_MS = 6_000
INTERNAL_TOPICS = ("__consumer_offsets", "__transaction_state")

CLUSTER_BROKER_CONFIG = {
    "group.initial.rebalance.delay.ms": "0",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500",
    "zookeeper.session.timeout.ms": str(SESSION_TIMEOUT_MS),
    "min.insync.replicas": "2",
    "default.replication.factor": "3",
    # the crash_prepare fault relies on the preferred leader getting the coordinator back soon
    "leader.imbalance.check.interval.seconds": "2",
    # A follower whose Fetch response the ``drop`` fault swallowed notices after this long and
    # fetches again; at Kafka's 30 s default, acks=all on its partitions waits past the writers'
    # message.timeout.ms (20 s), whose expiry makes librdkafka bump the epoch and resend.
    "replica.socket.timeout.ms": "5000",
}

CLUSTER_FAULTS: dict[str, int] = {
    "kill9": 3,
    "bounce": 2,
    "stop_leader": 2,
    "crash_prepare": 2,
    "kill_coordinator": 2,
    "isolate": 2,
    "drop": 1,
    "cut": 1,
    "pause": 1,
    "kill_client": 1,
}


class Bootstrap:
    """What a chaos ``Client`` needs of its broker: a bootstrap string (every broker's proxy)."""

    def __init__(self, proxies: list[FaultProxy]) -> None:
        self.proxies = proxies

    @property
    def bootstrap(self) -> str:
        return ",".join(p.bootstrap for p in self.proxies)


class ClusterChaos(Chaos):
    """``Chaos`` with ``brokers`` proxied brokers on ZooKeeper instead of one."""

    def __init__(self, cfg: ChaosConfig, zk_connect: str, brokers: int = 3) -> None:
        # the parent's single broker and proxy are not used: build ours instead
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        cfg.workdir.mkdir(parents=True, exist_ok=True)
        self.h = HistoryWriter(cfg.workdir / "hist-runner.jsonl", "runner")
        self.topic = f"chaos-{cfg.seed}"
        self.zk_connect = zk_connect
        self.nodes: list[ProxiedBroker] = []
        for i in range(brokers):
            proxy = FaultProxy().start()
            broker = Broker(
                cfg.workdir / f"data-{i}",
                cfg.workdir / f"broker-{i}.log",
                overrides={
                    **cluster_overrides(zk_connect, i),
                    **CLUSTER_BROKER_CONFIG,
                    "advertised.listeners": proxy.advertised_listener,
                },
                name=f"broker-{i}",
            )
            self.nodes.append(ProxiedBroker(broker, proxy))
        self.boot = Bootstrap([n.proxy for n in self.nodes])
        self.clients: list[Client] = []
        self.faults: list[str] = []
        self.zk = ClusterZk(zk_connect, session_timeout_ms=10_000)

    # ------------------------------------------------------------------ phases
    def setup(self) -> None:
        self.zk.start()
        for n in self.nodes:
            n.broker.start()
            n.proxy.set_upstream(n.broker.host, n.broker.port or 0)
        # every broker's own Metadata lists them all (topics are placed from the receiving broker's view)
        await_registered([n.broker for n in self.nodes])
        admin = AdminClient({"bootstrap.servers": self.boot.bootstrap, "log_level": 0})
        topic = NewTopic(
            self.topic,
            num_partitions=self.cfg.partitions,
            replication_factor=len(self.nodes),
            config={"min.insync.replicas": "2"},
        )
        admin.create_topics([topic])[self.topic].result(timeout=30)
        self.wait(lambda: self.isr_full([self.topic]), 30, "leaders and full ISRs")
        self.add_clients(self.boot)
        for c in self.clients:
            c.start()

    def add_clients(self, pb: Reachable) -> None:
        cfg = self.cfg
        for i in range(cfg.idem_writers):
            self.clients.append(Client(cfg, pb, self.topic, "idem", f"idem{i}", ["--rate", str(cfg.rate)]))
        for i in range(cfg.txn_writers):
            extra = ["--tid", f"chaos-{cfg.seed}-txn{i}", "--abort-prob", str(cfg.abort_prob)]
            self.clients.append(Client(cfg, pb, self.topic, "txn", f"txn{i}", extra))
        for iso in cfg.readers:
            self.clients.append(Client(cfg, pb, self.topic, "reader", f"{iso}-reader", ["--iso", iso]))

    # ------------------------------------------------------------- ZooKeeper view
    def states(self, topic: str) -> dict[int, tuple[int, tuple[int, ...]]]:
        """partition -> (leader, sorted ISR) as ZooKeeper holds them (the authority)."""
        out: dict[int, tuple[int, tuple[int, ...]]] = {}
        try:
            assignment = self.zk.topic_assignment(topic)
            for p in sorted(assignment.partitions if assignment is not None else ()):
                observed = self.zk.partition_state(TopicPartition(topic, p))
                if observed is not None:
                    lai = observed.state.leader_and_isr
                    out[p] = (lai.leader, tuple(sorted(lai.isr)))
        except KazooException:
            return {}
        return out

    def isr_full(self, topics: list[str]) -> bool:
        everyone = tuple(range(len(self.nodes)))
        for topic in topics:
            states = self.states(topic)
            if not states or any(leader < 0 or isr != everyone for leader, isr in states.values()):
                return False
        return True

    def preferred(self, topic: str, partition: int = 0) -> int | None:
        try:
            assignment = self.zk.topic_assignment(topic)
        except KazooException:
            return None
        if assignment is None or partition not in assignment.partitions:
            return None
        return assignment.partitions[partition][0]

    def leader(self, topic: str, partition: int = 0) -> int | None:
        state = self.states(topic).get(partition)
        return state[0] if state is not None and state[0] >= 0 else None

    @staticmethod
    def wait(cond: Any, timeout: float, what: str) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if cond():
                    return True
            except Exception:  # a broker mid-restart: ask again
                pass
            time.sleep(0.1)
        return False

    # ------------------------------------------------------------------ faults
    def apply(self, kind: str) -> dict[str, Any]:
        rng = self.rng
        if kind in ("kill9", "bounce"):
            i = rng.randrange(len(self.nodes))
            self.nodes[i].restart(clean=kind == "bounce")
            return {"broker": i}
        if kind == "kill_coordinator":
            coordinator = self.leader("__transaction_state")
            if coordinator is None:
                return {"broker": None}
            self.nodes[coordinator].restart(clean=False)
            return {"broker": coordinator}
        if kind == "stop_leader":
            p = rng.randrange(self.cfg.partitions)
            leader = self.leader(self.topic, p)
            if leader is None:
                return {"partition": p, "broker": None}
            secs = SESSION_TIMEOUT_MS / 1000 + rng.uniform(0.5, 2.0)
            proc = self.nodes[leader].broker.process
            assert proc is not None
            proc.send_signal(signal.SIGSTOP)
            try:
                time.sleep(secs)
            finally:
                proc.send_signal(signal.SIGCONT)
            return {"partition": p, "broker": leader, "seconds": round(secs, 2)}
        if kind == "crash_prepare":
            preferred = self.preferred("__transaction_state")
            if preferred is None:
                return {"broker": None}
            node = self.nodes[preferred]
            node.broker.env[FAULT_ENV] = "crash-after-prepare"
            node.restart(clean=rng.random() < 0.5)
            deadline = time.monotonic() + rng.uniform(4.0, 9.0)
            while node.broker.running and time.monotonic() < deadline:
                time.sleep(0.05)
            crashed = not node.broker.running
            node.broker.env.pop(FAULT_ENV, None)
            node.restart(clean=True)
            return {"broker": preferred, "crashed": crashed}
        if kind == "isolate":
            i, secs = rng.randrange(len(self.nodes)), rng.uniform(2.0, 6.0)
            proxy = self.nodes[i].proxy
            proxy.blackhole(secs)
            time.sleep(secs + 0.1)
            return {"broker": i, "seconds": round(secs, 2)}
        if kind == "drop":
            i, n, close = rng.randrange(len(self.nodes)), rng.randint(1, 3), rng.random() < 0.5
            proxy = self.nodes[i].proxy
            proxy.drop_responses(n, api_keys=None, close=close)
            time.sleep(rng.uniform(1.0, 2.5))
            return {"broker": i, "n": n, "close": close}
        if kind == "cut":
            i = rng.randrange(len(self.nodes))
            return {"broker": i, "closed": self.nodes[i].proxy.cut()}
        if kind in ("pause", "kill_client"):
            return self.client_fault(kind)
        raise ValueError(kind)

    def heal(self) -> None:
        for n in self.nodes:
            n.proxy.clear_faults()
            n.broker.env.pop(FAULT_ENV, None)
            proc = n.broker.process
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
            if not n.broker.running:
                n.restart(clean=True)
        for c in self.clients:
            if c.paused:
                c.resume()

    def finish(self) -> None:
        """Heal, wait for full ISRs everywhere, then the parent's stop/drain/read."""
        self.heal()
        topics = [self.topic, *INTERNAL_TOPICS]
        if not self.wait(lambda: self.isr_full(topics), 60, "full ISRs"):
            self.h.write("fault", what="ISRs not full 60 s after healing", states=str(self.all_states()))
        super().finish()

    def all_states(self) -> dict[str, Any]:
        return {t: self.states(t) for t in (self.topic, *INTERNAL_TOPICS)}

    def verify(self) -> None:
        """Replicas byte-identical (data and internal topics), written to the history as a
        ``replicas`` event (the checker counts a difference as ``replica_divergence``)."""
        last: list[Any] = []

        def identical() -> bool:
            nonlocal last
            try:
                last = verify_replicas(self.nodes[0].bootstrap, [self.topic, *INTERNAL_TOPICS], timeout_s=5)
            except WireError:
                return False
            return bool(last) and all(v.in_sync for v in last)

        same = self.wait(identical, 60, "replicas identical")
        self.h.write(
            "replicas", identical=same, partitions=len(last), verdicts=None if same else describe(last)
        )

    @property
    def bootstrap(self) -> str:
        return self.boot.bootstrap

    def close(self) -> None:
        for c in self.clients:
            c.kill()
        for n in self.nodes:
            proc = n.broker.process
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
            n.proxy.close()
            n.broker.close()
        try:
            self.zk.stop()
        except Exception:
            pass
        self.h.close()


def run_cluster(cfg: ChaosConfig, zk_connect: str, *, brokers: int = 3, keep: bool = False) -> RunResult:
    """One chaos round on a fresh ``brokers``-broker cluster under ``zk_connect`` (give each
    round its own chroot)."""
    if cfg.workdir.exists():
        shutil.rmtree(cfg.workdir)
    return run_chaos(ClusterChaos(cfg, zk_connect, brokers), keep=keep)
