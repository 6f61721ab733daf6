"""Run one chaos round: a broker behind a fault proxy, client processes, random faults, a final
read, and the checker.

``run_one(ChaosConfig(seed=S, workdir=W))`` -> ``RunResult``. The seed picks the fault schedule
and every client's random choices (partitions, aborts); thread timing is not reproducible, so a
seed replays the same plan rather than the same interleaving.

Faults (one at a time, each healed before the next; see ``FAULTS``):
  drop      the proxy throws away the next 1-3 responses of one API (or any), maybe closing
  delay     responses held back 0.2-1.5 s for a few seconds
  cut       every proxied connection closed
  blackhole nothing forwarded for 1-4 s
  kill9     broker SIGKILLed and restarted on the same data dir and port
  bounce    broker SIGTERMed (clean shutdown) and restarted
  crash_prepare  broker restarted with EXACTLY_FAULT=crash-after-prepare: it SIGKILLs itself
            after the next PrepareCommit/PrepareAbort is durable, before markers; then
            restarted without the fault (the coordinator must finish the transaction)
  pause     a writer SIGSTOPped for 1-8 s (long pauses outlive its transaction timeout: a zombie
            the coordinator aborts and fences), then SIGCONT
  kill_client  a client SIGKILLed and started again (a new generation; same transactional.id)
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from tests.chaos.checker import Report, check
from tests.chaos.history import HistoryWriter, load_history
from tests.support.broker import Broker, child_env
from tests.support.clients import create_topic
from tests.support.proxy import FaultProxy, ProxiedBroker

REPO = Path(__file__).resolve().parents[2]
FAULT_ENV = "EXACTLY_FAULT"
# errors of ListOffsets (the final end offsets) that a moment later may not be there
_RETRY_ENDS = {
    KafkaError.OFFSET_NOT_AVAILABLE,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.UNKNOWN_LEADER_EPOCH,
    KafkaError.FENCED_LEADER_EPOCH,
    KafkaError._TIMED_OUT,
    KafkaError._TRANSPORT,
}
# after healing, each writer must get a write through within this long (``stalled`` otherwise)
PROGRESS_S = 30.0

BROKER_CONFIG = {
    "group.initial.rebalance.delay.ms": "0",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500",
}

FAULTS: dict[str, int] = {
    "drop": 3,
    "delay": 2,
    "cut": 2,
    "blackhole": 2,
    "kill9": 2,
    "bounce": 1,
    "crash_prepare": 2,
    "pause": 2,
    "kill_client": 2,
}
# APIs whose responses "drop" targets (None = any): Produce, Fetch, InitProducerId,
# AddPartitionsToTxn, EndTxn, FindCoordinator, Metadata
DROP_APIS: list[int | None] = [None, 0, 1, 22, 24, 26, 10, 3]


@dataclass
class ChaosConfig:
    seed: int
    workdir: Path
    duration: float = 20.0
    partitions: int = 3
    idem_writers: int = 2
    txn_writers: int = 2
    readers: tuple[str, ...] = ("rc", "ru")
    rate: float = 40.0
    abort_prob: float = 0.3
    faults: dict[str, int] = field(default_factory=lambda: dict(FAULTS))


@dataclass
class RunResult:
    seed: int
    report: Report
    workdir: Path
    seconds: float
    faults: list[str]
    # what the runner noticed while healing (an ISR not full in time, a client that would not
    # stop): not anomalies, but worth a look
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.report.ok


class Reachable(Protocol):
    """Whatever a client bootstraps to: one proxied broker, or every broker of a cluster."""

    @property
    def bootstrap(self) -> str: ...


class Client:
    """A client process that can be paused, killed and started again (a new incarnation)."""

    def __init__(
        self, cfg: ChaosConfig, pb: Reachable, topic: str, role: str, base: str, extra: list[str]
    ) -> None:
        self.cfg, self.pb, self.topic, self.role, self.base, self.extra = cfg, pb, topic, role, base, extra
        self.incarnation = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False

    @property
    def writer(self) -> bool:
        return self.role in ("idem", "txn")

    def history_marks(self) -> dict[Path, int]:
        """How far each of this client's history files (one per incarnation) goes now."""
        return {p: p.stat().st_size for p in self.cfg.workdir.glob(f"hist-{self.base}-*.jsonl")}

    def progressed_since(self, marks: dict[Path, int]) -> bool:
        """Did a write of this writer go through after ``marks``: an acknowledged idempotent
        send, or a transaction committed (a later incarnation's file counts from its start)?"""
        for path in self.cfg.workdir.glob(f"hist-{self.base}-*.jsonl"):
            with path.open("rb") as f:
                f.seek(marks.get(path, 0))
                for raw in f:
                    try:
                        e = json.loads(raw)
                    except ValueError:
                        continue  # a line still being written
                    if e.get("t") == "ack" and self.role == "idem":
                        return True
                    if e.get("t") == "txn_end" and e.get("intent") == "commit" and e.get("result") == "ok":
                        return True
        return False

    def start(self) -> None:
        self.incarnation += 1
        name = f"{self.base}#{self.incarnation}"
        wd = self.cfg.workdir
        cmd = [
            sys.executable,
            "-m",
            "tests.chaos.client",
            "--role",
            self.role,
            "--name",
            name,
            "--bootstrap",
            self.pb.bootstrap,
            "--topic",
            self.topic,
            "--partitions",
            str(self.cfg.partitions),
            "--history",
            str(wd / f"hist-{self.base}-{self.incarnation}.jsonl"),
            "--stop-file",
            str(wd / "stop"),
            "--seed",
            str(self.cfg.seed),
            *self.extra,
        ]
        env = child_env(paths=[REPO])
        with (wd / f"{self.base}.log").open("ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        self.paused = False

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.signal(signal.SIGCONT)
        self.paused = False

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.resume()
            self.proc.kill()
            self.proc.wait(10)

    def wait(self, timeout: float) -> bool:
        if self.proc is None:
            return True
        try:
            self.proc.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False


class Chaos:
    def __init__(self, cfg: ChaosConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        cfg.workdir.mkdir(parents=True, exist_ok=True)
        self.h = HistoryWriter(cfg.workdir / "hist-runner.jsonl", "runner")
        self.topic = f"chaos-{cfg.seed}"
        self.proxy = FaultProxy().start()
        broker = Broker(
            cfg.workdir / "data",
            cfg.workdir / "broker.log",
            overrides={**BROKER_CONFIG, "advertised.listeners": self.proxy.advertised_listener},
            name=f"chaos-broker-{cfg.seed}",
        )
        self.pb = ProxiedBroker(broker, self.proxy)
        self.clients: list[Client] = []
        self.faults: list[str] = []

    @property
    def broker(self) -> Broker:
        return self.pb.broker

    @property
    def bootstrap(self) -> str:
        """Where the runner's own consumers (final reads) bootstrap."""
        return self.pb.bootstrap

    # ------------------------------------------------------------------ phases
    def setup(self) -> None:
        self.broker.start()
        self.proxy.set_upstream(self.broker.host, self.broker.port or 0)
        create_topic(self.pb.bootstrap, self.topic, partitions=self.cfg.partitions)
        cfg = self.cfg
        for i in range(cfg.idem_writers):
            self.clients.append(
                Client(cfg, self.pb, self.topic, "idem", f"idem{i}", ["--rate", str(cfg.rate)])
            )
        for i in range(cfg.txn_writers):
            self.clients.append(
                Client(
                    cfg,
                    self.pb,
                    self.topic,
                    "txn",
                    f"txn{i}",
                    ["--tid", f"chaos-{cfg.seed}-txn{i}", "--abort-prob", str(cfg.abort_prob)],
                )
            )
        for iso in cfg.readers:
            self.clients.append(Client(cfg, self.pb, self.topic, "reader", f"{iso}-reader", ["--iso", iso]))
        for c in self.clients:
            c.start()

    def inject(self) -> None:
        cfg, rng = self.cfg, self.rng
        kinds = list(cfg.faults)
        weights = [cfg.faults[k] for k in kinds]
        end = time.monotonic() + cfg.duration
        time.sleep(rng.uniform(1.0, 2.0))  # let the clients get going
        while time.monotonic() < end:
            kind = rng.choices(kinds, weights)[0]
            detail = self.apply(kind)
            self.faults.append(kind)
            self.h.write("fault", what=kind, **detail)
            self.heal()
            time.sleep(rng.uniform(0.3, 1.5))

    def apply(self, kind: str) -> dict[str, Any]:
        rng, proxy = self.rng, self.proxy
        if kind == "drop":
            n, api, close = rng.randint(1, 3), rng.choice(DROP_APIS), rng.random() < 0.5
            proxy.drop_responses(n, api_keys=api, close=close)
            time.sleep(rng.uniform(1.0, 2.5))
            return {"n": n, "api": api, "close": close, "left": proxy.pending_drops()}
        if kind == "delay":
            secs, hold = rng.uniform(0.2, 1.5), rng.uniform(1.0, 4.0)
            proxy.set_delay(secs)
            time.sleep(hold)
            proxy.set_delay(0)
            return {"seconds": round(secs, 2), "for": round(hold, 2)}
        if kind == "cut":
            return {"closed": proxy.cut()}
        if kind == "blackhole":
            secs = rng.uniform(1.0, 4.0)
            proxy.blackhole(secs)
            time.sleep(secs + 0.1)
            return {"seconds": round(secs, 2)}
        if kind in ("kill9", "bounce"):
            self.pb.restart(clean=kind == "bounce")
            return {"pid": self.broker.pid}
        if kind == "crash_prepare":
            clean = rng.random() < 0.5
            self.broker.env[FAULT_ENV] = "crash-after-prepare"
            self.pb.restart(clean=clean)
            deadline = time.monotonic() + rng.uniform(3.0, 8.0)
            while self.broker.running and time.monotonic() < deadline:
                time.sleep(0.05)
            crashed = not self.broker.running
            self.broker.env.pop(FAULT_ENV, None)
            self.pb.restart(clean=True)
            return {"crashed": crashed, "clean_first": clean}
        if kind in ("pause", "kill_client"):
            return self.client_fault(kind)
        raise ValueError(kind)

    def client_fault(self, kind: str) -> dict[str, Any]:
        """Faults of the clients, not the brokers (shared by the cluster round)."""
        rng = self.rng
        if kind == "pause":
            writers = [c for c in self.clients if c.writer]
            c = rng.choice(writers)
            secs = rng.uniform(1.0, 3.0) if rng.random() < 0.6 else rng.uniform(7.0, 9.0)
            c.pause()
            time.sleep(secs)
            c.resume()
            return {"client": c.base, "seconds": round(secs, 2)}
        if kind == "kill_client":
            c = rng.choice(self.clients)
            c.kill()
            time.sleep(rng.uniform(0.0, 1.0))
            c.start()
            return {"client": c.base, "incarnation": c.incarnation}
        raise ValueError(kind)

    def heal(self) -> None:
        self.proxy.clear_faults()
        self.broker.env.pop(FAULT_ENV, None)
        if not self.broker.running:
            self.pb.restart(clean=True)
        for c in self.clients:
            if c.paused:
                c.resume()

    def finish(self) -> None:
        """Heal, check the writers make progress again, stop them, wait for open transactions
        to end, read everything."""
        self.heal()
        self.await_progress()
        (self.cfg.workdir / "stop").touch()
        for c in self.clients:
            if not c.wait(45):
                self.h.write("fault", what="client did not stop; killed", client=c.base)
                c.kill()
        parts = list(range(self.cfg.partitions))
        deadline = time.monotonic() + 30
        hw, lso = self.ends(parts, "read_uncommitted"), self.ends(parts, "read_committed")
        while lso != hw and time.monotonic() < deadline:
            time.sleep(0.5)
            hw, lso = self.ends(parts, "read_uncommitted"), self.ends(parts, "read_committed")
        if lso != hw:
            self.h.write("hung", hw=hw, lso=lso)
        for iso, ends in (("rc", lso), ("ru", hw)):
            recs, upto = self.read_all(parts, iso, ends)
            self.h.write("read", iso=iso, session=f"final-{iso}", final=True, recs=recs, upto=upto)

    def await_progress(self) -> None:
        """Liveness once healed: every writer must get a write through (an idempotent ack, a
        committed transaction) within ``PROGRESS_S``; otherwise a ``stalled`` event, which the
        checker counts as an anomaly. Without this wait a round whose faults kept the writers
        busy with timeouts until the end passed with nothing committed, and a writer stuck for
        good after the faults would pass as well."""
        writers = [c for c in self.clients if c.writer]
        marks = {c.base: c.history_marks() for c in writers}
        deadline = time.monotonic() + PROGRESS_S
        pending = writers
        while True:
            pending = [c for c in pending if not c.progressed_since(marks[c.base])]
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        if pending:
            self.h.write("stalled", writers=[c.base for c in pending], seconds=PROGRESS_S)

    def ends(self, parts: list[int], isolation: str) -> dict[int, int]:
        c = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": "chaos-final",
                "isolation.level": isolation,
                "log_level": 0,
            }
        )
        try:
            return {p: self._end(c, p) for p in parts}
        finally:
            c.close()

    def _end(self, c: Consumer, partition: int) -> int:
        """The partition's end offset, asked again on a retriable error: a leader elected a
        moment ago answers OFFSET_NOT_AVAILABLE until its high watermark has caught up (Kafka's
        rule), and the cluster's preferred-leader rebalance can move a leader at any time."""
        deadline = time.monotonic() + 30
        while True:
            try:
                tp = TopicPartition(self.topic, partition)
                return int(c.get_watermark_offsets(tp, timeout=10, cached=False)[1])
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if (
                    not isinstance(err, KafkaError)
                    or err.code() not in _RETRY_ENDS
                    or time.monotonic() > deadline
                ):
                    raise
                time.sleep(0.5)

    def read_all(
        self, parts: list[int], iso: str, ends: dict[int, int]
    ) -> tuple[list[list[Any]], dict[int, int]]:
        c = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": "chaos-final",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 100,
                "log_level": 0,
                "isolation.level": "read_committed" if iso == "rc" else "read_uncommitted",
            }
        )
        recs: list[list[Any]] = []
        positions: dict[int, int] = dict.fromkeys(parts, 0)
        try:
            c.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in parts])
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                for m in c.consume(num_messages=1000, timeout=0.2):
                    if m.error() is None:
                        recs.append(
                            [int(m.partition() or 0), int(m.offset() or 0), (m.value() or b"").decode()]
                        )
                for tp in c.position([TopicPartition(self.topic, p) for p in parts]):
                    if tp.offset >= 0:
                        positions[tp.partition] = tp.offset
                if all(positions[p] >= ends[p] for p in parts):
                    break
        finally:
            c.close()
        return recs, {p: min(positions[p], ends[p]) for p in parts}

    def verify(self) -> None:
        """After the final reads: checks beyond the history (the cluster checks its replicas)."""

    def close(self) -> None:
        for c in self.clients:
            c.kill()
        self.proxy.close()
        self.broker.close()
        self.h.close()


def run_one(cfg: ChaosConfig, *, keep: bool = False) -> RunResult:
    if cfg.workdir.exists():
        shutil.rmtree(cfg.workdir)
    return run_chaos(Chaos(cfg), keep=keep)


def run_chaos(chaos: Chaos, *, keep: bool = False) -> RunResult:
    """Set up, inject faults, heal and read, verify, check the history (the run directory is
    removed afterwards if the run passed, unless ``keep``)."""
    cfg = chaos.cfg
    started = time.monotonic()
    try:
        chaos.setup()
        chaos.inject()
        chaos.finish()
        chaos.verify()
    finally:
        chaos.close()
    events = load_history(cfg.workdir)
    report = check(events)
    (cfg.workdir / "report.json").write_text(json.dumps(report.as_dict(), indent=1, default=str))
    notes = [
        str(e["what"])
        for e in events
        if e["t"] == "fault" and e.get("proc") == "runner" and e.get("what") not in cfg.faults
    ]
    result = RunResult(cfg.seed, report, cfg.workdir, time.monotonic() - started, chaos.faults, notes)
    # a round without a single committed transaction passed, but its writers made no progress:
    # keep it to look at (a liveness problem, not an anomaly)
    if report.ok and not keep and report.stats.get("committed", 0) > 0:
        shutil.rmtree(cfg.workdir, ignore_errors=True)
    return result
