"""Transaction coordinator failover on the replicated cluster (issue #10): kill -9 the broker that leads
``__transaction_state`` (the coordinator of every transactional id: one partition) while a producer
commits transactions in a loop; seconds to the next successful ``commit_transaction()``.

Helpers (FindCoordinator, read-back checks) are shared with bench/benchlib/cluster_txn_workloads.py.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any, ClassVar

from confluent_kafka import KafkaException, Producer
from kazoo.client import KazooClient

from benchlib import drivers, kafka
from benchlib.brokers import BrokerProcess
from benchlib.cluster import DEFAULT_SESSION_TIMEOUT_MS, Cluster
from benchlib.cluster_txn_workloads import (
    TXN_STATE_STATE_ZNODE,
    check_read_back,
    coordinator_of,
    find_coordinator,
    read_committed,
    stable_and_high,
    txn_value,
)
from benchlib.cluster_workloads import _load1, _place, _start_cluster
from benchlib.workloads import Context, Target, Workload, register
from exactly.client.wire import WireClient, WireError
from exactly.topics import TRANSACTION_STATE_TOPIC


class CoordinatorKill(Workload):
    """A transactional producer (acks=all, linger.ms=0) runs transactions of ``per_txn`` 1 KB records
    back to back -- begin, produce, ``commit_transaction()`` -- to an RF 3 topic (min.insync.replicas=2)
    led by a broker *other than* the coordinator (so what is measured is the coordinator's move, not a
    data leader's).  1 s in, a timer thread sends kill -9 to the coordinator's broker C (the leader of
    ``__transaction_state``-0, found with FindCoordinator) at t0, wherever the producer is in its loop.

    ``commit_transaction()`` is called with a 1 s timeout and called again while it fails retriably
    (librdkafka: the transaction stays in its committing state); an abortable error aborts the
    transaction (``abort_transaction()``, retried alike) and the loop goes on with a new one.
    Measured from t0:

    - ``failover_s``: the first ``commit_transaction()`` call *begun after C was reaped* that succeeds
      (only the new coordinator can have answered its EndTxn);
    - ``gone_s``: C's ``/brokers/ids`` znode disappeared (session expiry);
    - ``elected_s``: the ``__transaction_state``-0 state znode names another leader;
    - ``coordinator_s``: FindCoordinator at a surviving broker (every 10 ms, connections opened before
      t0) first names another broker without error -- what a client can learn; the rest up to
      ``failover_s`` is the new coordinator loading the log, the client's back-offs and the commit.

    Verified: the read_committed read-back of the topic holds every record of every committed
    transaction exactly once and nothing of an aborted one (no loss, no duplicates across the
    failover), and no transaction is left open (LSO = high watermark).  C is restarted afterwards and
    the run waits for a full ISR of ``__transaction_state`` again; the next repetition kills whichever
    broker is the coordinator then."""

    kind = "coordinator-failover"
    peer_ok = False
    own_broker = True
    session_timeout_ms: ClassVar[int] = DEFAULT_SESSION_TIMEOUT_MS
    per_txn: ClassVar[int] = 10
    call_timeout_s: ClassVar[float] = 1.0

    def setup(self, ctx: Context, broker: BrokerProcess | None) -> dict[str, Any]:
        return {"cluster": _start_cluster(ctx, self.name, self.session_timeout_ms)}

    def run_once(
        self, ctx: Context, broker: BrokerProcess | None, state: dict[str, Any], rep: int
    ) -> dict[str, Any]:
        cluster: Cluster = state["cluster"]
        tid = f"bench-coordinator-{uuid.uuid4().hex[:8]}"
        p = Producer(
            {
                "bootstrap.servers": cluster.bootstrap,
                **drivers.PRODUCE_CONF,
                "linger.ms": 0,
                "transactional.id": tid,
                "transaction.timeout.ms": 2 * self.session_timeout_ms + 60_000,
                "message.timeout.ms": 2 * self.session_timeout_ms + 60_000,
                **kafka.QUIET,
            }
        )
        p.init_transactions(60)  # the first FindCoordinator creates the transaction log
        cluster.wait_full_isr(TRANSACTION_STATE_TOPIC, 1, 3, timeout=120)
        coordinator = coordinator_of(cluster, tid)
        _leader, _r, _isr, controller = cluster.partition(TRANSACTION_STATE_TOPIC)
        data_leader = next(i for i, b in enumerate(cluster.brokers) if i != coordinator and b.running)
        topic = _place(cluster, self.name, 3, leader=data_leader)
        victim = cluster.brokers[coordinator]
        survivors = [b for i, b in enumerate(cluster.brokers) if i != coordinator and b.running]
        marks: dict[str, int] = {}
        now_ns = time.perf_counter_ns
        stop = threading.Event()

        zk = KazooClient(hosts=cluster.zk_connect, timeout=10)
        zk.start(15)

        def on_ids(children: list[str]) -> None:
            if "t0" in marks and str(coordinator) not in children and "gone" not in marks:
                marks["gone"] = now_ns()

        def on_state(data: bytes | None, _stat: Any) -> None:
            if "t0" not in marks or "elected" in marks or not data:
                return
            new = json.loads(data).get("leader", -1)
            if new not in (coordinator, -1):
                marks["elected"] = now_ns()
                marks["new_coordinator"] = new

        probes = [WireClient.connect(b.bootstrap, timeout=5, client_id="bench-probe") for b in survivors]

        def coordinator_probe() -> None:
            while not stop.is_set():
                for c in probes:
                    try:
                        node, _code = find_coordinator(c, tid)
                    except WireError:
                        continue
                    if node not in (coordinator, -1):
                        marks["coordinator"] = now_ns()
                        return
                stop.wait(0.01)

        def killer() -> None:
            if stop.wait(1.0):
                return
            marks["t0"] = now_ns()
            victim.kill()  # SIGKILL and reap: C is gone when this returns
            marks["killed"] = now_ns()
            coordinator_probe()

        zk.ChildrenWatch("/brokers/ids", on_ids)
        zk.DataWatch(TXN_STATE_STATE_ZNODE, on_state)
        pad = ctx.pool[0]
        committed: set[int] = set()
        aborted: set[int] = set()
        errors: list[str] = []
        retries = 0
        limit_s = self.session_timeout_ms / 1000 + 60
        thread = threading.Thread(target=killer, daemon=True)

        def settle(call: Any, what: str, t: int) -> bool:
            """Call ``commit_transaction``/``abort_transaction`` until it succeeds (True) or the transaction
            must be aborted (False); fatal errors and the time limit raise."""
            nonlocal retries
            for _ in range(1_000_000):
                began = now_ns()
                try:
                    call(self.call_timeout_s)
                except KafkaException as exc:
                    err = exc.args[0]
                    if err.fatal() or time.perf_counter() - start > limit_s:
                        raise
                    if err.txn_requires_abort():
                        return False
                    retries += 1
                    continue
                if (
                    what == "commit"
                    and "killed" in marks
                    and began > marks["killed"]
                    and "first" not in marks
                ):
                    marks["first"] = now_ns()
                return True
            raise RuntimeError(f"{what} of transaction {t} never settled")

        start = time.perf_counter()
        t = 0
        try:
            p.list_topics(topic, timeout=30)
            thread.start()
            for t in range(10_000_000):
                p.begin_transaction()
                for i in range(self.per_txn):
                    p.produce(topic, txn_value(t, i, pad))
                if settle(p.commit_transaction, "commit", t):
                    committed.add(t)
                else:
                    settle(p.abort_transaction, "abort", t)
                    aborted.add(t)
                if "first" in marks and now_ns() - marks["first"] > 500_000_000:
                    break  # 0.5 s of commits on the new coordinator, then stop
                if time.perf_counter() - start > limit_s:
                    errors.append(f"no commit after the kill succeeded in {limit_s:.0f} s")
                    break
        except (KafkaException, RuntimeError) as exc:
            errors.append(f"transaction {t}: {exc}")
        finally:
            stop.set()
            thread.join(10)
            for c in probes:
                c.close()
            zk.stop()
            zk.close()
        if victim.running:  # the loop failed before the timer fired
            victim.kill()
        seen = read_committed(cluster.bootstrap, topic, len(committed) * self.per_txn)
        errors += check_read_back(seen, committed, self.per_txn, aborted)
        _start, lso, hw = stable_and_high(cluster.bootstrap, topic)
        if lso != hw:
            errors.append(f"last stable offset {lso} < high watermark {hw}: a transaction left open")
        t0 = marks.get("t0")

        def since(key: str) -> float | None:
            return (marks[key] - t0) / 1e9 if t0 is not None and key in marks else None

        rejoin_s = cluster.rejoin(victim, TRANSACTION_STATE_TOPIC)
        cluster.delete_topic(topic)
        return {
            "ok": not errors and "first" in marks,
            "error": "; ".join(errors)[:1000],
            "failover_s": since("first"),
            "gone_s": since("gone"),
            "elected_s": since("elected"),
            "coordinator_s": since("coordinator"),
            "victim": coordinator,
            "new_coordinator": marks.get("new_coordinator"),
            "victim_was_controller": coordinator == controller,
            "data_leader": data_leader,
            "committed": len(committed),
            "aborted": len(aborted),
            "retries": retries,
            "session_timeout_ms": self.session_timeout_ms,
            "rejoin_s": rejoin_s,
            "load1": _load1(),
        }

    def teardown(self, ctx: Context, broker: BrokerProcess | None, state: dict[str, Any]) -> None:
        state["cluster"].stop()


@register
class CoordinatorKill9Short(CoordinatorKill):
    name = "coordinator-kill9-s2"
    title = (
        "3-broker cluster: transaction coordinator's broker kill -9 -> next successful commit_transaction, "
        "zookeeper.session.timeout.ms=2000"
    )
    session_timeout_ms = 2_000
    targets = (Target("failover_s", "<=", 4.0, "s to the next commit (session timeout 2 s + 2 s)", "#10"),)


@register
class CoordinatorKill9Default(CoordinatorKill):
    name = "coordinator-kill9-s18"
    title = (
        "3-broker cluster: transaction coordinator's broker kill -9 -> next successful commit_transaction, "
        "zookeeper.session.timeout.ms=18000 (default)"
    )
    session_timeout_ms = DEFAULT_SESSION_TIMEOUT_MS
    default = False  # ~25 s per repetition, mostly waiting for the session to expire; run with --only
    targets = (Target("failover_s", "<=", 20.0, "s to the next commit (session timeout 18 s + 2 s)", "#10"),)
