"""Workload registry.

A workload is a class with ``name``, ``kind`` and ``targets`` that implements ``setup`` / ``run_once`` /
``teardown``; ``run_once`` returns a flat ``dict`` sample (see ``Sample keys`` in bench/README.md).  The
harness (bench/run.py) runs ``repeat`` samples per broker and reports the median.  To add a workload,
subclass ``Workload`` and decorate it with ``@register`` — it then shows up in ``--list`` and ``--only``.

Kinds decide the report table: ``throughput``, ``latency``, ``recovery``, ``physical``.
"""

from __future__ import annotations

import math
import shutil
import statistics
import struct
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from confluent_kafka import OFFSET_BEGINNING, Producer, TopicPartition

from benchlib import brokers, drivers, kafka, physical, procstat
from benchlib.brokers import BrokerProcess

GB = 1e9
MB = 1e6


@dataclass(frozen=True)
class Target:
    metric: str
    op: str  # ">=" or "<="
    value: float
    label: str

    def met(self, measured: float | None) -> bool | None:
        if measured is None:
            return None
        return measured >= self.value if self.op == ">=" else measured <= self.value

    def text(self) -> str:
        sign = "≥" if self.op == ">=" else "≤"
        return f"{sign} {self.value:g} {self.label}"


@dataclass
class Context:
    """Run-wide settings and shared scratch state handed to every workload."""

    quick: bool
    records: int
    repeat: int
    scratch: Path
    kcat_env: dict[str, str]
    latency_seconds: float
    latency_rate: int
    recovery_bytes: int
    broker_options: list[str]
    pool: list[bytes]
    tansu_bin: Path | None = None
    _lines: Path | None = None
    datasets: dict[tuple[str, int], tuple[str, int]] | None = None

    def lines_file(self) -> Path:
        if self._lines is None:
            self._lines = drivers.write_lines_file(
                self.scratch / f"records-{self.records}.txt", self.records, self.pool
            )
        return self._lines

    def timeout_for(self, nbytes: int) -> float:
        """Generous bound for one timed section: 60 s + 1 s per MB (a 1 MB/s floor)."""
        return 60.0 + nbytes / MB

    def dataset(self, broker: BrokerProcess, partitions: int) -> tuple[str, int]:
        """A topic holding ``records`` records (loaded once per broker with kcat), for consume workloads."""
        if self.datasets is None:
            self.datasets = {}
        key = (broker.bootstrap, partitions)
        if key not in self.datasets:
            topic = f"bench-data-p{partitions}-{uuid.uuid4().hex[:6]}"
            kafka.create_topic(broker.bootstrap, topic, partitions)
            run = drivers.kcat_produce(
                broker.bootstrap,
                topic,
                self.lines_file(),
                self.records,
                len(self.pool[0]),
                self.timeout_for(self.records * len(self.pool[0])),
                self.kcat_env,
            )
            if run.errors:
                raise RuntimeError(f"loading {topic} failed: {run.errors}")
            n = self.count_records(broker, topic, partitions)
            if n != self.records:
                raise RuntimeError(f"loading {topic}: log holds {n} records, sent {self.records}")
            self.datasets[key] = (topic, n)
        return self.datasets[key]

    def warmup_topic(self, broker: BrokerProcess) -> str:
        """A 1-partition topic for warm-up records that must not land in a measured topic."""
        key = (broker.bootstrap, -1)
        if self.datasets is None:
            self.datasets = {}
        if key not in self.datasets:
            topic = f"bench-warmup-{uuid.uuid4().hex[:6]}"
            kafka.create_topic(broker.bootstrap, topic, 1)
            self.datasets[key] = (topic, 0)
        return self.datasets[key][0]

    def count_records(self, broker: BrokerProcess, topic: str, partitions: int) -> int:
        """Records in the log.  exactly: ListOffsets (log end - log start), which is part of what is under
        test.  Peers whose ListOffsets is known to be off (Tansu answers "latest" with the last batch's base
        offset) are counted by reading the topic back with kcat instead."""
        if broker.info.get("verify") == "consume":
            run = drivers.kcat_consume(broker.bootstrap, topic, 0, len(self.pool[0]), 600, self.kcat_env)
            if run.errors:
                raise RuntimeError(f"counting {topic} by consuming: {run.errors}")
            return run.records
        return kafka.record_count(broker.bootstrap, topic, partitions)

    def drop_datasets(self, broker: BrokerProcess) -> None:
        datasets = self.datasets or {}
        for key in [k for k in datasets if k[0] == broker.bootstrap]:
            kafka.delete_topic(broker.bootstrap, datasets.pop(key)[0])


class Workload:
    name: ClassVar[str] = ""
    kind: ClassVar[str] = "throughput"
    title: ClassVar[str] = ""
    targets: ClassVar[tuple[Target, ...]] = ()
    needs_broker: ClassVar[bool] = True
    peer_ok: ClassVar[bool] = True  # also run against --peer brokers
    default: ClassVar[bool] = True  # part of a plain `run.py` (else only via --only)
    own_broker: ClassVar[bool] = False  # starts/kills its own broker (gets broker=None)

    def setup(self, ctx: Context, broker: BrokerProcess | None) -> Any:
        return None

    def run_once(self, ctx: Context, broker: BrokerProcess | None, state: Any, rep: int) -> dict[str, Any]:
        raise NotImplementedError

    def teardown(self, ctx: Context, broker: BrokerProcess | None, state: Any) -> None:
        return None

    def repeats(self, ctx: Context) -> int:
        return ctx.repeat


REGISTRY: dict[str, type[Workload]] = {}


def register(cls: type[Workload]) -> type[Workload]:
    assert cls.name and cls.name not in REGISTRY, cls.name
    REGISTRY[cls.name] = cls
    return cls


# ------------------------------------------------------------------------------------------ helpers


class Meter:
    """Broker CPU, machine-wide busy CPU and wall clock around a timed section."""

    def __init__(self, broker: BrokerProcess | None) -> None:
        self.broker = broker

    def __enter__(self) -> Meter:
        self.b0 = self.broker.cpu_seconds() if self.broker else 0.0
        self.m0 = procstat.machine_busy_ticks()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.t0
        self.broker_cpu = (
            (self.broker.cpu_seconds() - self.b0) if self.broker and self.broker.alive() else 0.0
        )
        m1 = procstat.machine_busy_ticks()
        self.machine_cpu = (m1[0] - self.m0[0]) / procstat.CLK_TCK


def throughput_sample(run: drivers.ClientRun, meter: Meter, expected: int) -> dict[str, Any]:
    gb = run.bytes / GB
    errors = list(run.errors)
    if run.records != expected:
        errors.append(f"moved {run.records} records, expected {expected}")
    other = meter.machine_cpu - meter.broker_cpu - run.client_cpu_s
    return {
        "ok": not errors,
        "error": "; ".join(errors)[:1000],
        "wall_s": run.wall_s,
        "records": run.records,
        "bytes": run.bytes,
        "mb_s": run.bytes / MB / run.wall_s if run.wall_s else 0.0,
        "records_s": run.records / run.wall_s if run.wall_s else 0.0,
        "broker_cpu_s": meter.broker_cpu,
        "broker_cpu_s_per_gb": meter.broker_cpu / gb if gb else None,
        "broker_cores": meter.broker_cpu / run.wall_s if run.wall_s else 0.0,
        "client_cpu_s": run.client_cpu_s,
        "client_cpu_s_per_gb": run.client_cpu_s / gb if gb else None,
        "client_cores": run.client_cpu_s / run.wall_s if run.wall_s else 0.0,
        "other_cpu_s": max(0.0, other),
        **run.extra,
    }


def _topic(prefix: str, broker: BrokerProcess, rep: int) -> str:
    return f"{prefix}-{broker.name}-r{rep}-{uuid.uuid4().hex[:6]}"


# --------------------------------------------------------------------------------------- throughput

PRODUCE_TARGETS = (
    Target("mb_s", ">=", 150, "MB/s"),
    Target("broker_cpu_s_per_gb", "<=", 1.5, "broker CPU-s/GB"),
)
CONSUME_TARGETS = (Target("mb_s", ">=", 300, "MB/s"),)


class ProduceWorkload(Workload):
    client: ClassVar[str] = "confluent"
    partitions: ClassVar[int] = 1
    targets = PRODUCE_TARGETS

    def setup(self, ctx: Context, broker: BrokerProcess | None) -> list[str]:
        if self.client == "kcat":
            ctx.lines_file()
        return []

    def run_once(
        self, ctx: Context, broker: BrokerProcess | None, state: list[str], rep: int
    ) -> dict[str, Any]:
        assert broker is not None
        topic = _topic(self.name, broker, rep)
        kafka.create_topic(broker.bootstrap, topic, self.partitions)
        state.append(topic)
        size = len(ctx.pool[0])
        timeout = ctx.timeout_for(ctx.records * size)
        warmup = ctx.warmup_topic(broker) if self.client == "confluent" else None
        with Meter(broker) as meter:
            if self.client == "kcat":
                run = drivers.kcat_produce(
                    broker.bootstrap, topic, ctx.lines_file(), ctx.records, size, timeout, ctx.kcat_env
                )
            else:
                run = drivers.confluent_produce(
                    broker.bootstrap, topic, ctx.records, ctx.pool, timeout, warmup_topic=warmup
                )
        in_log = ctx.count_records(broker, topic, self.partitions)
        if in_log != run.records:
            run.errors.append(f"log holds {in_log} records, producer reported {run.records} delivered")
        sample = throughput_sample(run, meter, ctx.records)
        sample["records_in_log"] = in_log
        return sample

    def teardown(self, ctx: Context, broker: BrokerProcess | None, state: list[str]) -> None:
        assert broker is not None
        for topic in state:
            kafka.delete_topic(broker.bootstrap, topic)


class ConsumeWorkload(Workload):
    client: ClassVar[str] = "confluent"
    partitions: ClassVar[int] = 1
    targets = CONSUME_TARGETS

    def setup(self, ctx: Context, broker: BrokerProcess | None) -> tuple[str, int]:
        assert broker is not None
        return ctx.dataset(broker, self.partitions)

    def run_once(
        self, ctx: Context, broker: BrokerProcess | None, state: tuple[str, int], rep: int
    ) -> dict[str, Any]:
        assert broker is not None
        topic, expected = state
        size = len(ctx.pool[0])
        timeout = ctx.timeout_for(expected * size)
        with Meter(broker) as meter:
            if self.client == "kcat":
                run = drivers.kcat_consume(broker.bootstrap, topic, expected, size, timeout, ctx.kcat_env)
            else:
                run = drivers.confluent_consume(broker.bootstrap, topic, self.partitions, expected, timeout)
        if run.bytes != expected * size:
            run.errors.append(f"payload bytes {run.bytes} != {expected * size}")
        return throughput_sample(run, meter, expected)


def _make_throughput(kind: str, client: str, partitions: int) -> type[Workload]:
    base = ProduceWorkload if kind == "produce" else ConsumeWorkload
    verb = "produce" if kind == "produce" else "consume"
    name = f"{verb}-{client}-p{partitions}"
    title = (
        f"{verb} 1 KB records, {partitions} partition{'s' if partitions > 1 else ''}, "
        f"{'confluent-kafka (Python)' if client == 'confluent' else 'kcat (C)'}"
    )
    cls = type(
        name.replace("-", "_"),
        (base,),
        {"name": name, "title": title, "client": client, "partitions": partitions},
    )
    return register(cls)


for _kind in ("produce", "consume"):
    for _client in ("confluent", "kcat"):
        for _parts in (1, 4):
            _make_throughput(_kind, _client, _parts)


# ------------------------------------------------------------------------------------------ latency


def percentile(sorted_vals: list[float], q: float) -> float | None:
    if not sorted_vals:
        return None
    idx = min(len(sorted_vals) - 1, max(0, math.ceil(q / 100 * len(sorted_vals)) - 1))  # nearest rank
    return sorted_vals[idx]


@register
class LatencyFixedRate(Workload):
    """Produce at a fixed rate (1,000 msg/s) with linger.ms=0, acks=all, idempotent; a consumer thread
    reads the same partition.  ack = produce() -> delivery report; e2e = produce() -> consumer poll."""

    name = "latency-1k"
    kind = "latency"
    title = "latency at a fixed 1,000 msg/s, 1 KB, 1 partition, acks=all"

    def setup(self, ctx: Context, broker: BrokerProcess | None) -> list[str]:
        return []

    def run_once(
        self, ctx: Context, broker: BrokerProcess | None, state: list[str], rep: int
    ) -> dict[str, Any]:
        assert broker is not None
        topic = _topic(self.name, broker, rep)
        kafka.create_topic(broker.bootstrap, topic, 1)
        state.append(topic)
        rate, seconds = ctx.latency_rate, ctx.latency_seconds
        total = int(rate * seconds)
        ack: list[float] = []
        e2e: list[float] = []
        errors: list[str] = []
        stop = threading.Event()
        consumer_ready = threading.Event()
        now_ns = time.perf_counter_ns

        def consume() -> None:
            c = kafka.consumer(broker.bootstrap)
            try:
                c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
                consumer_ready.set()
                end = time.monotonic() + seconds + 60
                while len(e2e) < total and time.monotonic() < end and not stop.is_set():
                    # poll(), not consume(num_messages=N): consume() waits for N records or the timeout
                    m = c.poll(0.05)
                    t = now_ns()
                    if m is None or m.error() is not None:
                        continue
                    e2e.append((t - struct.unpack_from(">Q", m.value())[0]) / 1e6)
            finally:
                c.close()

        def on_delivery(err: Any, msg: Any) -> None:
            t = now_ns()
            if err is not None:
                if len(errors) < 20:
                    errors.append(str(err))
                return
            ack.append((t - struct.unpack_from(">Q", msg.value())[0]) / 1e6)

        p = Producer(
            {"bootstrap.servers": broker.bootstrap, **drivers.PRODUCE_CONF, "linger.ms": 0, **kafka.QUIET}
        )
        p.list_topics(topic, timeout=30)
        reader = threading.Thread(target=consume, daemon=True)
        reader.start()
        consumer_ready.wait(30)
        time.sleep(0.5)  # let the consumer's first fetch go out
        pad = ctx.pool[0][8:]
        interval = 1.0 / rate
        with Meter(broker) as meter:
            start = time.perf_counter()
            for i in range(total):
                due = start + i * interval
                for _ in range(100_000):
                    left = due - time.perf_counter()
                    if left <= 0:
                        break
                    p.poll(min(left, 0.001))
                p.produce(topic, struct.pack(">Q", now_ns()) + pad, on_delivery=on_delivery)
                p.poll(0)
            p.flush(30)
            achieved = total / (time.perf_counter() - start)
        deadline = time.monotonic() + 30
        while len(e2e) < total and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        reader.join(60)
        in_log = ctx.count_records(broker, topic, 1)
        if len(ack) != total:
            errors.append(f"{len(ack)}/{total} delivery reports")
        if len(e2e) != total:
            errors.append(f"consumer saw {len(e2e)}/{total}")
        if in_log != total:
            errors.append(f"log holds {in_log}, sent {total}")
        ack.sort()
        e2e.sort()
        sample: dict[str, Any] = {
            "ok": not errors,
            "error": "; ".join(errors)[:1000],
            "records": total,
            "achieved_rate": achieved,
            "wall_s": meter.wall,
            "broker_cpu_s": meter.broker_cpu,
            "broker_cores": meter.broker_cpu / meter.wall if meter.wall else 0.0,
        }
        for label, vals in (("ack", ack), ("e2e", e2e)):
            for q, key in ((50, "p50"), (99, "p99"), (99.9, "p999")):
                sample[f"{label}_{key}_ms"] = percentile(vals, q)
            sample[f"{label}_max_ms"] = vals[-1] if vals else None
        return sample

    def teardown(self, ctx: Context, broker: BrokerProcess | None, state: list[str]) -> None:
        assert broker is not None
        for topic in state:
            kafka.delete_topic(broker.bootstrap, topic)


# ----------------------------------------------------------------------------------------- recovery


@register
class RecoveryKill9(Workload):
    """Fill ~1 GB (quick: ~100 MB) over 100 partitions, kill -9 the broker, restart it on the same data
    dir; time to the listening line and to ListOffsets reporting every partition's pre-kill end offset.
    Page cache is warm (no drop_caches), so this is the CPU cost of recovery, not disk read speed."""

    name = "recovery-kill9"
    kind = "recovery"
    title = "restart after kill -9, 100 partitions"
    peer_ok = False  # Tansu runs on memory:// here: nothing to recover
    own_broker = True
    partitions = 100

    def setup(self, ctx: Context, broker: BrokerProcess | None) -> dict[str, Any]:
        work = Path(ctx.scratch) / f"recovery-{uuid.uuid4().hex[:6]}"
        data = work / "data"
        records = max(self.partitions, ctx.recovery_bytes // len(ctx.pool[0]))
        lines = drivers.write_lines_file(ctx.scratch / f"recovery-{records}.txt", records, ctx.pool)
        b = brokers.start_exactly(data, ctx.broker_options)
        topic = "recovery"
        kafka.create_topic(b.bootstrap, topic, self.partitions)
        t0 = time.perf_counter()
        run = drivers.kcat_produce(
            b.bootstrap,
            topic,
            lines,
            records,
            len(ctx.pool[0]),
            ctx.timeout_for(records * len(ctx.pool[0])) * 2,
            ctx.kcat_env,
        )
        fill_s = time.perf_counter() - t0
        if run.errors:
            b.kill9()
            raise RuntimeError(f"recovery fill failed: {run.errors}")
        offs = kafka.offsets(b.bootstrap, topic, self.partitions)
        if sum(hi - lo for lo, hi in offs) != records:
            b.kill9()
            raise RuntimeError(f"recovery fill: log holds {sum(hi - lo for lo, hi in offs)}, sent {records}")
        lines.unlink(missing_ok=True)
        return {
            "broker": b,
            "data": data,
            "topic": topic,
            "offsets": offs,
            "records": records,
            "bytes": records * len(ctx.pool[0]),
            "fill_s": fill_s,
            "work": work,
        }

    def run_once(
        self, ctx: Context, broker: BrokerProcess | None, state: dict[str, Any], rep: int
    ) -> dict[str, Any]:
        state["broker"].kill9()
        b = brokers.start_exactly(
            state["data"], ctx.broker_options, log_name=f"restart{rep}.log", timeout=600
        )
        state["broker"] = b
        listen_s = b.ready_s
        errors: list[str] = []
        offs: list[tuple[int, int]] = []
        for _ in range(100_000):
            try:
                offs = kafka.offsets(b.bootstrap, state["topic"], self.partitions, timeout=10)
                if offs == state["offsets"]:
                    break
            except Exception as exc:
                errors = [str(exc)]
            if time.monotonic() - b.started_at > 600:
                errors.append(f"offsets after restart {sum(h for _, h in offs)} != before")
                break
            time.sleep(0.02)
        else:
            errors.append("gave up polling")
        ready_s = time.monotonic() - b.started_at
        ok = offs == state["offsets"]
        return {
            "ok": ok,
            "error": "" if ok else "; ".join(errors)[:1000],
            "listen_s": listen_s,
            "ready_s": ready_s,
            "broker_cpu_s": b.cpu_seconds(),
            "data_gb": state["bytes"] / GB,
            "records": state["records"],
            "fill_s": state["fill_s"],
            "fill_mb_s": state["bytes"] / MB / state["fill_s"],
            "rss_mb": b.rss_mb()[0],
        }

    def teardown(self, ctx: Context, broker: BrokerProcess | None, state: dict[str, Any]) -> None:
        state["broker"].stop()
        shutil.rmtree(state["work"], ignore_errors=True)


# ----------------------------------------------------------------------------------------- physical


@register
class LoopbackTcp(Workload):
    name = "loopback-tcp"
    kind = "physical"
    title = "loopback TCP, one connection, 1 MB sendall() for ~2 s (Python threads)"
    needs_broker = False
    peer_ok = False

    def run_once(self, ctx: Context, broker: BrokerProcess | None, state: Any, rep: int) -> dict[str, Any]:
        run = physical.loopback_tcp(1.0 if ctx.quick else 2.0)
        return {
            "ok": run.bytes > 0,
            "error": "",
            "wall_s": run.wall_s,
            "bytes": run.bytes,
            "mb_s": run.bytes / MB / run.wall_s,
            "client_cpu_s": run.client_cpu_s,
        }


@register
class PageCacheWrite(Workload):
    name = "pagecache-write"
    kind = "physical"
    title = "page-cache write, 1 MB write()s to a /tmp file, no fsync"
    needs_broker = False
    peer_ok = False

    def run_once(self, ctx: Context, broker: BrokerProcess | None, state: Any, rep: int) -> dict[str, Any]:
        total = (256 if ctx.quick else 1024) << 20
        run = physical.pagecache_write(ctx.scratch, total)
        return {
            "ok": run.bytes == total,
            "error": "",
            "wall_s": run.wall_s,
            "bytes": run.bytes,
            "mb_s": run.bytes / MB / run.wall_s,
            "client_cpu_s": run.client_cpu_s,
        }


# -------------------------------------------------------------------------------------------- stats


def median_of(samples: list[dict[str, Any]], key: str) -> float | None:
    vals = [s[key] for s in samples if s.get("ok") and isinstance(s.get(key), int | float)]
    return statistics.median(vals) if vals else None


def spread_of(samples: list[dict[str, Any]], key: str) -> tuple[float, float] | None:
    vals = [s[key] for s in samples if s.get("ok") and isinstance(s.get(key), int | float)]
    return (min(vals), max(vals)) if vals else None
