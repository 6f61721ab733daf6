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
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from confluent_kafka import Producer, TopicPartition

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
    issue: str = "#2"

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
    pair_factor: int = 2
    _lines: Path | None = None
    _pools: dict[int, list[bytes]] | None = None
    datasets: dict[tuple[str, int], tuple[str, int]] | None = None

    def lines_file(self) -> Path:
        if self._lines is None:
            self._lines = drivers.write_lines_file(
                self.scratch / f"records-{self.records}.txt", self.records, self.pool
            )
        return self._lines

    def pool_for(self, size: int) -> list[bytes]:
        """Payload pool of ``size``-byte values (``pool`` itself for the default 1 KB)."""
        if size == len(self.pool[0]):
            return self.pool
        if self._pools is None:
            self._pools = {}
        if size not in self._pools:
            self._pools[size] = drivers.payload_pool(size)
        return self._pools[size]

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

    def count_records(self, broker: BrokerProcess, topic: str, partitions: int, size: int = 0) -> int:
        """Records in the log.  exactly: ListOffsets (log end - log start), which is part of what is under
        test.  Peers whose ListOffsets is known to be off (Tansu answers "latest" with the last batch's base
        offset) are counted by reading the topic back with kcat instead."""
        if broker.info.get("verify") == "consume":
            run = drivers.kcat_consume(
                broker.bootstrap, topic, 0, size or len(self.pool[0]), 600, self.kcat_env
            )
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

    def measured_broker(self, broker: BrokerProcess | None, state: Any) -> BrokerProcess | None:
        """The broker process this workload actually loads (profiling, RSS): ``broker`` unless the
        workload started a private one in ``setup``."""
        return broker

    def profiled_brokers(self, broker: BrokerProcess | None, state: Any) -> list[tuple[str, BrokerProcess]]:
        """(label, process) pairs that ``--profile`` records during the first repetition: the measured
        broker by default; a cluster workload names its leader and a follower."""
        target = self.measured_broker(broker, state)
        return [("", target)] if target is not None else []


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
    Target("broker_cpu_s_per_gb", "<=", 1.0, "broker CPU-s/GB", "#5"),
)
PRODUCE_SMALL_TARGETS = (Target("broker_cpu_s_per_gb", "<=", 1.0, "broker CPU-s/GB", "#5"),)
CONSUME_TARGETS = (Target("mb_s", ">=", 300, "MB/s"),)


class ProduceWorkload(Workload):
    client: ClassVar[str] = "confluent"
    partitions: ClassVar[int] = 1
    record_size: ClassVar[int] = drivers.RECORD_SIZE
    records_factor: ClassVar[int] = 1  # records per run = ctx.records * records_factor
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
        size = self.record_size
        records = ctx.records * self.records_factor
        timeout = ctx.timeout_for(records * max(size, 1024))
        warmup = ctx.warmup_topic(broker) if self.client == "confluent" else None
        with Meter(broker) as meter:
            if self.client == "kcat":
                assert size == len(ctx.pool[0]) and records == ctx.records
                run = drivers.kcat_produce(
                    broker.bootstrap, topic, ctx.lines_file(), records, size, timeout, ctx.kcat_env
                )
            else:
                run = drivers.confluent_produce(
                    broker.bootstrap, topic, records, ctx.pool_for(size), timeout, warmup_topic=warmup
                )
        in_log = ctx.count_records(broker, topic, self.partitions, size)
        if in_log != run.records:
            run.errors.append(f"log holds {in_log} records, producer reported {run.records} delivered")
        sample = throughput_sample(run, meter, records)
        sample["records_in_log"] = in_log
        sample["record_size"] = size
        # free the disk / Tansu's memory now rather than at teardown
        kafka.delete_topic(broker.bootstrap, topic)
        state.remove(topic)
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
    if _kind == "produce":
        # issue #5: small records too (per-record and per-batch costs weigh more than per-byte ones)
        for _parts in (1, 4):
            register(
                type(
                    f"produce_confluent_100b_p{_parts}",
                    (ProduceWorkload,),
                    {
                        "name": f"produce-confluent-100b-p{_parts}",
                        "title": f"produce 100 B records, {_parts} partition{'s' if _parts > 1 else ''}, "
                        "confluent-kafka (Python), 3x the records",
                        "partitions": _parts,
                        "record_size": 100,
                        "records_factor": 3,
                        "targets": PRODUCE_SMALL_TARGETS,
                    },
                )
            )


# ------------------------------------------------------------------------------------ paired (A / B)

TXN_TARGETS = (
    Target("ratio", ">=", 0.97, "txn / idempotent MB/s", "#3"),
    Target("ratio", ">=", 0.98, "txn / idempotent MB/s", "#5"),
)
RC_TARGETS = (
    Target("ratio", ">=", 0.97, "read_committed / read_uncommitted MB/s scanned", "#3"),
    Target("ratio", ">=", 0.98, "read_committed / read_uncommitted MB/s scanned", "#5"),
)


def _prefixed(prefix: str, sample: dict[str, Any]) -> dict[str, Any]:
    return {f"{prefix}_{k}": v for k, v in sample.items() if k not in ("ok", "error")}


class PairWorkload(Workload):
    """Two variants measured back to back in every repetition (order alternating), so the ratio of each
    pair is taken under the same machine conditions; the report shows the median of the per-pair ratios.
    Sample keys: ``<a>_*`` and ``<b>_*`` (each a throughput sample), ``ratio`` = a / b."""

    kind = "pair"
    a: ClassVar[str] = ""
    b: ClassVar[str] = ""
    ratio_of: ClassVar[str] = ""

    def repeats(self, ctx: Context) -> int:
        return ctx.repeat if ctx.quick else ctx.repeat + 2


class TxnVsIdempotent(PairWorkload):
    """Transactional producer committing every 100 ms vs the idempotent producer; same loop, same 1 KB
    records, same settings (acks=all, linger.ms=10, 1 MB batches), ``ctx.records * pair_factor`` records
    each, fresh topic each."""

    a, b = "txn", "idem"
    ratio_of = "MB/s acked (transactional incl. its commits) / MB/s acked (idempotent)"
    partitions: ClassVar[int] = 1
    targets = TXN_TARGETS
    interval_s: ClassVar[float] = 0.1

    def setup(self, ctx: Context, broker: BrokerProcess | None) -> list[str]:
        return []

    def _one(
        self, ctx: Context, broker: BrokerProcess, state: list[str], rep: int, mode: str
    ) -> dict[str, Any]:
        topic = _topic(f"{self.name}-{mode}", broker, rep)
        kafka.create_topic(broker.bootstrap, topic, self.partitions)
        state.append(topic)
        records = ctx.records * ctx.pair_factor
        size = len(ctx.pool[0])
        txn = mode == "txn"
        conf = {"transactional.id": f"bench-{topic}"} if txn else None
        with Meter(broker) as meter:
            run = drivers.confluent_produce(
                broker.bootstrap,
                topic,
                records,
                ctx.pool,
                ctx.timeout_for(records * size),
                conf=conf,
                warmup_topic=ctx.warmup_topic(broker),
                txn_interval_s=self.interval_s if txn else None,
            )
        in_log = ctx.count_records(broker, topic, self.partitions)
        if broker.info.get("verify") == "consume":  # counted by reading back: data records only
            if in_log != run.records:
                run.errors.append(f"read back {in_log} records, producer reported {run.records}")
        else:  # ListOffsets: data records + one commit marker per partition per transaction
            markers = in_log - run.records
            commits = int(run.extra.get("commits", 0))
            lo, hi = (commits, commits * self.partitions) if txn else (0, 0)
            if not lo <= markers <= hi:
                run.errors.append(
                    f"log holds {in_log} offsets for {run.records} records: {markers} control records, "
                    f"expected {lo}..{hi}"
                )
        sample = throughput_sample(run, meter, records)
        sample["offsets_in_log"] = in_log
        kafka.delete_topic(broker.bootstrap, topic)
        state.remove(topic)
        return sample

    def run_once(
        self, ctx: Context, broker: BrokerProcess | None, state: list[str], rep: int
    ) -> dict[str, Any]:
        assert broker is not None
        order = [self.b, self.a] if rep % 2 == 0 else [self.a, self.b]
        parts = {mode: self._one(ctx, broker, state, rep, mode) for mode in order}
        a, b = parts[self.a], parts[self.b]
        errors = [f"{m}: {parts[m]['error']}" for m in order if not parts[m]["ok"]]
        out: dict[str, Any] = {
            "ok": not errors,
            "error": "; ".join(errors)[:1000],
            "order": "/".join(order),
            "ratio": a["mb_s"] / b["mb_s"] if b["mb_s"] else None,
            "cpu_ratio": (
                a["broker_cpu_s_per_gb"] / b["broker_cpu_s_per_gb"]
                if a.get("broker_cpu_s_per_gb") and b.get("broker_cpu_s_per_gb")
                else None
            ),
        }
        out.update(_prefixed(self.a, a))
        out.update(_prefixed(self.b, b))
        return out

    def teardown(self, ctx: Context, broker: BrokerProcess | None, state: list[str]) -> None:
        assert broker is not None
        for topic in state:
            kafka.delete_topic(broker.bootstrap, topic)


class ReadCommittedVsUncommitted(PairWorkload):
    """A topic of ``ctx.records`` 1 KB records written in transactions of 1,000 records, every third one
    aborted after its records were flushed (so they are in the log).  read_committed must deliver exactly
    the committed records, read_uncommitted all of them.  Both modes fetch (scan) the same log bytes --
    Kafka sends aborted batches to read_committed consumers with the aborted-transaction list and the
    client drops them -- so the ratio is of MB/s of log scanned (= inverse wall-time ratio); delivered
    records/s are reported too."""

    a, b = "rc", "ru"
    ratio_of = "MB/s of log scanned, read_committed / read_uncommitted"
    partitions: ClassVar[int] = 1
    client: ClassVar[str] = "kcat"
    targets = RC_TARGETS
    txn_records: ClassVar[int] = 1000

    def setup(self, ctx: Context, broker: BrokerProcess | None) -> dict[str, Any]:
        assert broker is not None
        topic = f"{self.name}-{broker.name}-{uuid.uuid4().hex[:6]}"
        kafka.create_topic(broker.bootstrap, topic, self.partitions)
        t0 = time.perf_counter()
        committed, aborted, txns, errors = drivers.confluent_txn_fill(
            broker.bootstrap,
            topic,
            ctx.records,
            ctx.pool,
            self.txn_records,
            3,
            ctx.timeout_for(ctx.records * 1024),
        )
        fill_s = time.perf_counter() - t0
        if errors:
            raise RuntimeError(f"filling {topic}: {errors}")
        in_log = ctx.count_records(broker, topic, self.partitions)
        total = committed + aborted
        if broker.info.get("verify") == "consume":
            if in_log != total:
                raise RuntimeError(f"{topic}: read back {in_log} records, wrote {total}")
        elif not txns <= in_log - total <= txns * self.partitions:
            raise RuntimeError(f"{topic}: {in_log} offsets for {total} records in {txns} transactions")
        return {
            "topic": topic,
            "committed": committed,
            "aborted": aborted,
            "total": total,
            "txns": txns,
            "fill_s": fill_s,
        }

    def run_once(
        self, ctx: Context, broker: BrokerProcess | None, state: dict[str, Any], rep: int
    ) -> dict[str, Any]:
        assert broker is not None
        size = len(ctx.pool[0])
        total, committed, aborted = state["total"], state["committed"], state["aborted"]
        scanned = total * size
        order = [self.b, self.a] if rep % 2 == 0 else [self.a, self.b]
        parts: dict[str, dict[str, Any]] = {}
        unsupported = ""
        for mode in order:
            rc = mode == "rc"
            expected = committed if rc else total
            conf = {"isolation.level": "read_committed" if rc else "read_uncommitted"}
            with Meter(broker) as meter:
                if self.client == "kcat":
                    run = drivers.kcat_consume(
                        broker.bootstrap,
                        state["topic"],
                        expected,
                        size,
                        ctx.timeout_for(scanned),
                        ctx.kcat_env,
                        conf,
                        mark=b"A",
                    )
                else:
                    run = drivers.confluent_consume_to_eof(
                        broker.bootstrap,
                        state["topic"],
                        self.partitions,
                        expected,
                        ctx.timeout_for(scanned),
                        conf,
                    )
            marked = int(run.extra.get("marked", 0))
            if rc and marked:
                unsupported = (
                    f"fails filtering: read_committed delivered {marked} of {aborted} aborted records"
                )
                # the clock stopped at the committed count; time the whole (unfiltered) read instead
                run.wall_s = float(run.extra.get("eof_s", run.extra.get("exit_s", run.wall_s)))
            elif run.records != expected:
                run.errors.append(f"{mode}: delivered {run.records} records, expected {expected}")
            elif not rc and marked != aborted:
                run.errors.append(f"ru: {marked} aborted records delivered, expected {aborted}")
            elif run.bytes != expected * size:
                run.errors.append(f"{mode}: payload bytes {run.bytes} != {expected * size}")
            sample = throughput_sample(run, meter, run.records)
            # throughput_sample's mb_s / CPU per GB are of delivered bytes; rate both modes on the log scanned
            sample["delivered_mb_s"] = sample["mb_s"]
            sample["mb_s"] = scanned / MB / run.wall_s if run.wall_s else 0.0
            sample["broker_cpu_s_per_gb"] = meter.broker_cpu / (scanned / GB)
            sample["client_cpu_s_per_gb"] = run.client_cpu_s / (scanned / GB)
            sample["aborted_delivered"] = marked
            parts[mode] = sample
        a, b = parts[self.a], parts[self.b]
        errors = [f"{m}: {parts[m]['error']}" for m in order if not parts[m]["ok"]]
        out: dict[str, Any] = {
            "ok": not errors and not unsupported,
            "error": "; ".join([unsupported, *errors] if unsupported else errors)[:1000],
            "unsupported": unsupported,
            "order": "/".join(order),
            "ratio": a["mb_s"] / b["mb_s"] if b["mb_s"] else None,
            "records_ratio": a["records_s"] / b["records_s"] if b["records_s"] else None,
            "cpu_ratio": a["broker_cpu_s_per_gb"] / b["broker_cpu_s_per_gb"]
            if b["broker_cpu_s_per_gb"]
            else None,
            "log_records": total,
            "aborted_records": aborted,
            "transactions": state["txns"],
        }
        out.update(_prefixed(self.a, a))
        out.update(_prefixed(self.b, b))
        return out

    def teardown(self, ctx: Context, broker: BrokerProcess | None, state: dict[str, Any]) -> None:
        assert broker is not None
        kafka.delete_topic(broker.bootstrap, state["topic"])


for _parts in (1, 4):
    register(
        type(
            f"txn_produce_p{_parts}",
            (TxnVsIdempotent,),
            {
                "name": f"txn-produce-p{_parts}",
                "title": f"transactional (commit every 100 ms) vs idempotent produce, 1 KB, {_parts} "
                f"partition{'s' if _parts > 1 else ''}, confluent-kafka",
                "partitions": _parts,
            },
        )
    )
for _client, _parts, _default in (("kcat", 1, True), ("confluent", 1, True), ("kcat", 4, False)):
    _cname = "" if _client == "kcat" else "-confluent"
    register(
        type(
            f"rc_consume{_cname.replace('-', '_')}_p{_parts}",
            (ReadCommittedVsUncommitted,),
            {
                "name": f"rc-consume{_cname}-p{_parts}",
                "title": f"read_committed vs read_uncommitted consume, 1 KB, {_parts} partition"
                f"{'s' if _parts > 1 else ''}, 1/3 of transactions aborted, "
                f"{'kcat (C)' if _client == 'kcat' else 'confluent-kafka (Python)'}",
                "partitions": _parts,
                "client": _client,
                "default": _default,
            },
        )
    )


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
    targets = (Target("ack_p99_ms", "<=", 3.0, "ms produce-to-ack p99", "#5"),)

    def setup(self, ctx: Context, broker: BrokerProcess | None) -> list[str]:
        return []

    def run_once(
        self, ctx: Context, broker: BrokerProcess | None, state: list[str], rep: int
    ) -> dict[str, Any]:
        assert broker is not None
        topic = _topic(self.name, broker, rep)
        kafka.create_topic(broker.bootstrap, topic, 1)
        state.append(topic)
        return fixed_rate_latency(ctx, broker, topic)

    def teardown(self, ctx: Context, broker: BrokerProcess | None, state: list[str]) -> None:
        assert broker is not None
        for topic in state:
            kafka.delete_topic(broker.bootstrap, topic)


#: The fixed-rate loop's shortest ``poll`` timeout. confluent-kafka truncates a timeout to whole
#: milliseconds, so ``poll(left)`` with under 1 ms left is ``poll(0)``: the loop spins through the
#: rest of every 1 ms interval, on the 2 cores the brokers it measures share. 0 (the default) keeps
#: that loop, so figures stay comparable across sessions; 0.001 blocks in ``poll`` instead (a record
#: then leaves up to ~1 ms after its due time; its latency counts from its actual send). Paired at
#: load 11 (bench/client_spin_ab.py, bench/results/rf3tail-s18.md) the blocking loop had the lower
#: p50 in 4/4 pairs but a far worse p99 in 4/4: not adopted without a quiet-box comparison.
LATENCY_POLL_MIN_S = 0.0


#: Records ``warm_up_producer`` writes to a measured topic before its window (offsets below this).
WARMUP_RECORDS = 1


def warm_up_producer(p: Producer, topic: str, pad: bytes) -> None:
    """Write ``WARMUP_RECORDS`` record(s) (a timestamp and ``pad``, like the measured ones) to
    partition 0 of ``topic`` and wait for the ack, before a latency window starts.

    Why: librdkafka's idempotent producer sends no record before it has a producer id, and when
    its first attempt at one finds no broker connection up (the partition leader's connection is
    a new one, opened after ``list_topics``' bootstrap connection) it retries on a fixed 500 ms
    timer (``rd_kafka_idemp_pid_timer_restart``). A window that started before that timer fired
    held its first records ~500 ms: on the box at load 5, 2 of 60 fresh producers' first acks took
    501-521 ms, the producer's round trips stayed under 3 ms and its queue latency was 500.9 ms
    (``bench/cleaner_loop_stall.py``, ``bench/results/stall-s20.md``); that was the ~500 ms
    busy-window stall of ``cleaner-produce-latency`` in ``compaction-quiet-s19.md``. The warm-up's
    ack means the producer id and the leader's connection are there when the window starts."""
    for _ in range(WARMUP_RECORDS):
        p.produce(topic, struct.pack(">Q", time.perf_counter_ns()) + pad, partition=0)
    if p.flush(30) != 0:
        raise RuntimeError(f"the warm-up record to {topic} was not acked within 30 s")


def fixed_rate_latency(
    ctx: Context,
    broker: Any,
    topic: str,
    window: AbstractContextManager[Any] | None = None,
    *,
    keep_acks: bool = False,
) -> dict[str, Any]:
    """``ctx.latency_rate`` records/s for ``ctx.latency_seconds`` to partition 0 of ``topic`` (linger.ms=0,
    acks=all, idempotent) with a consumer thread reading it: ack and end-to-end latency percentiles.
    ``broker``: a ``BrokerProcess`` or anything with ``bootstrap``, ``cpu_seconds()``, ``alive()`` and
    ``info`` (bench/benchlib/cluster.py's ``Cluster``: CPU summed over its brokers). ``window``, if
    given, is entered right before the first record is sent and left once the last is acked (the
    clients are set up outside it): what the measured window runs under. ``keep_acks``: the sample
    also holds every ack latency, in send order (``ack_ms``), to pool windows or find stalls."""
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
            c.assign([TopicPartition(topic, 0, WARMUP_RECORDS)])  # after the warm-up record
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
    pad = ctx.pool[0][8:]
    warm_up_producer(p, topic, pad)
    drivers.deprioritise_io_threads()
    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    consumer_ready.wait(30)
    time.sleep(0.5)  # let the consumer's first fetch go out
    interval = 1.0 / rate
    with window if window is not None else nullcontext(), Meter(broker) as meter:
        start = time.perf_counter()
        for i in range(total):
            due = start + i * interval
            for _ in range(100_000):
                left = due - time.perf_counter()
                if left <= 0:
                    break
                p.poll(max(min(left, 0.001), LATENCY_POLL_MIN_S))
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
    in_send_order = list(ack)
    if len(ack) != total:
        errors.append(f"{len(ack)}/{total} delivery reports")
    if len(e2e) != total:
        errors.append(f"consumer saw {len(e2e)}/{total}")
    if in_log != total + WARMUP_RECORDS:
        errors.append(f"log holds {in_log}, sent {total} (+{WARMUP_RECORDS} warm-up)")
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
    if keep_acks:
        sample["ack_ms"] = in_send_order
    return sample


# ------------------------------------------------------------------------------------------- groups


class GroupFirstAssignment(Workload):
    """A fresh consumer subscribes to a 4-partition topic under a new group id: seconds from
    ``subscribe()`` to its first assignment callback (FindCoordinator, JoinGroup twice (KIP-394
    member id), SyncGroup).  exactly runs on a private broker started with
    ``group.initial.rebalance.delay.ms=<delay_ms>``; peers run on the shared broker with their own
    settings.  The very first join on a broker (exactly creates ``__consumer_offsets`` then) is done in
    setup and reported as *cold*."""

    kind = "group"
    delay_ms: ClassVar[int] = 0
    partitions: ClassVar[int] = 4

    def setup(self, ctx: Context, broker: BrokerProcess | None) -> dict[str, Any]:
        assert broker is not None
        private = None
        target = broker
        if broker.name == "exactly":
            opts = [*ctx.broker_options, f"group.initial.rebalance.delay.ms={self.delay_ms}"]
            private = brokers.start_exactly(
                ctx.scratch / f"group-d{self.delay_ms}-{uuid.uuid4().hex[:6]}", opts
            )
            target = private
        state: dict[str, Any] = {"broker": target, "private": private}
        try:
            topic = f"{self.name}-{uuid.uuid4().hex[:6]}"
            kafka.create_topic(target.bootstrap, topic, self.partitions)
            state["topic"] = topic
            if private is not None:  # a peer's first join is not special-cased (and Tansu's takes ~20 s)
                cold, _n, errs = drivers.confluent_first_assignment(
                    target.bootstrap, topic, f"bench-cold-{uuid.uuid4().hex[:8]}"
                )
                state["cold_s"], state["cold_errors"] = cold, errs
        except BaseException:
            if private is not None:
                private.stop()
            raise
        return state

    def measured_broker(self, broker: BrokerProcess | None, state: Any) -> BrokerProcess | None:
        return state["broker"] if isinstance(state, dict) else broker

    def run_once(
        self, ctx: Context, broker: BrokerProcess | None, state: dict[str, Any], rep: int
    ) -> dict[str, Any]:
        target: BrokerProcess = state["broker"]
        with Meter(target) as meter:
            secs, n, errs = drivers.confluent_first_assignment(
                target.bootstrap, state["topic"], f"bench-g-{uuid.uuid4().hex[:8]}"
            )
        errors = []
        if secs is None:
            errors = errs or ["no assignment"]
        elif n != self.partitions:
            errors = [f"assigned {n} of {self.partitions} partitions"]
        sample: dict[str, Any] = {
            "ok": not errors,
            "error": "; ".join(errors)[:1000],
            "assign_s": secs,
            "partitions": n,
            "client_errors": "; ".join(errs)[:300],
            "broker_cpu_s": meter.broker_cpu,
            "delay_ms": self.delay_ms if target.name == "exactly" else None,
        }
        if rep == 0:
            sample["cold_s"] = state.get("cold_s")
        return sample

    def teardown(self, ctx: Context, broker: BrokerProcess | None, state: dict[str, Any]) -> None:
        if state.get("topic") and state["broker"].alive():
            kafka.delete_topic(state["broker"].bootstrap, state["topic"])
        if state.get("private") is not None:
            state["private"].stop()


@register
class GroupAssignDelay0(GroupFirstAssignment):
    name = "group-assign-delay0"
    title = "consumer group: subscribe -> first assignment, exactly with group.initial.rebalance.delay.ms=0"
    delay_ms = 0
    targets = (Target("assign_s", "<=", 0.5, "s to first assignment", "#5"),)


@register
class GroupAssignDelay3000(GroupFirstAssignment):
    name = "group-assign-delay3000"
    title = "consumer group: subscribe -> first assignment, exactly with the Kafka default delay (3000 ms)"
    delay_ms = 3000
    peer_ok = False  # the peer's figure does not depend on exactly's setting: see group-assign-delay0


# ----------------------------------------------------------------------------------------- recovery


@register
class RecoveryKill9(Workload):
    """Fill ~1 GB (quick: ~100 MB) over 100 partitions, kill -9 the broker, restart it on the same data
    dir; time to the listening line and to ListOffsets reporting every partition's pre-kill end offset.
    Page cache is warm (no drop_caches), so this is the CPU cost of recovery, not disk read speed."""

    name = "recovery-kill9"
    kind = "recovery"
    title = "restart after kill -9, 100 partitions"
    targets = (Target("ready_s", "<=", 2.0, "s to offsets ok (1 GB, 100 partitions)", "#5"),)
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


@register
class EchoRtt(Workload):
    """The floor under latency-1k's ack latency on this box: same rate, same 1 KB, one request in
    flight, to an echo server instead of a broker. A broker cannot beat this figure's tail; when
    it is above the 3 ms target the box, not the broker, is what misses it."""

    name = "latency-echo-1k"
    kind = "latency"
    title = "physical limit: 1 KB request/response to an asyncio (uvloop) echo server, 1,000/s, no broker"
    needs_broker = False
    peer_ok = False

    def run_once(self, ctx: Context, broker: BrokerProcess | None, state: Any, rep: int) -> dict[str, Any]:
        rtts, wall, server_cpu = physical.echo_rtt(ctx.latency_rate, ctx.latency_seconds)
        sample: dict[str, Any] = {
            "ok": bool(rtts),
            "error": "",
            "wall_s": wall,
            "achieved_rate": len(rtts) / wall,
            "broker_cores": server_cpu / wall,  # the echo server's
        }
        for q, key in ((50, "p50"), (99, "p99"), (99.9, "p999")):
            sample[f"ack_{key}_ms"] = percentile(rtts, q)
        sample["ack_max_ms"] = rtts[-1] if rtts else None
        return sample


# -------------------------------------------------------------------------------------------- stats


def median_of(samples: list[dict[str, Any]], key: str) -> float | None:
    vals = [s[key] for s in samples if s.get("ok") and isinstance(s.get(key), int | float)]
    return statistics.median(vals) if vals else None


def spread_of(samples: list[dict[str, Any]], key: str) -> tuple[float, float] | None:
    vals = [s[key] for s in samples if s.get("ok") and isinstance(s.get(key), int | float)]
    return (min(vals), max(vals)) if vals else None
