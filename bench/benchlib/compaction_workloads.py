"""Log compaction (issue #11): cleaner throughput, produce latency while the cleaner runs vs idle,
and the long-running shape of the internal topics (size and restart time with cleaning on vs off).

Every workload here starts its own brokers (``own_broker``) because each needs broker settings of
its own (the cleaner on or off, its back-off, the internal topics' segment size) and a data dir it
can stop and restart on.

- ``cleaner-throughput``: a compacted 1-partition topic is filled on a broker with
  ``log.cleaner.enable=false`` (so nothing is cleaned while it is written), the broker is stopped and
  restarted on the same data dir with the cleaner on (``log.cleaner.backoff.ms=100``): its first pass
  cleans the whole backlog with no other load. MB/s = bytes the pass read / the pass's time, both
  from ``/metrics`` (``exactly_log_cleaner_bytes_read``, ``exactly_log_cleaner_max_clean_time_seconds``).
- ``cleaner-throughput-100b``: the same with 100 B values (the size of an offset commit): the
  cleaner's cost is per record, so MB/s is far lower.
- ``cleaner-produce-latency`` and its diagnostic variant: in ``compaction_latency``.
- ``compaction-internal``: two brokers side by side, one with the cleaner on and one with
  ``log.cleaner.enable=false``, take the same load written through the wire (``exactly.client.wire``):
  OffsetCommit requests of 100 partitions each over ``groups`` x 100 keys, and transactions of
  AddOffsetsToTxn + TxnOffsetCommit + EndTxn(commit) round-robin over ``tids`` transactional ids. Then
  (the cleaner settles) the bytes of ``__consumer_offsets`` and ``__transaction_state`` on each, and
  restart times to *ready* (listening, and the group and transaction coordinators answer: OffsetFetch
  gives the last committed offset, InitProducerId succeeds) of both, and of a fresh broker (empty data
  dir, same settings). Both internal topics run with 1 partition and small segments
  (``offsets.topic.segment.bytes`` / ``transaction.state.log.segment.bytes``): the cleaner never
  touches the active segment, so with Kafka's 100 MB default and this much data nothing would be
  cleanable at all; a month-old broker has rolled its segments (``segment.ms`` 7 days).
- ``compaction-internal-month`` (``compaction_month``): the same load interleaved and paced over a
  month compressed in time, ``delete.retention.ms`` one simulated day.
"""

from __future__ import annotations

import datetime
import os
import re
import shutil
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from benchlib import brokers, kafka
from benchlib.brokers import BrokerProcess
from benchlib.workloads import MB, Context, Target, Workload, register
from exactly.client.wire import WireClient, error_name
from exactly.protocol.apis import ApiKey, build

COMPACT_TOPIC = "compacted"
KEYS = 1000


def load1() -> float:
    return os.getloadavg()[0]


def scrape(broker: BrokerProcess) -> dict[str, float]:
    """``/metrics`` of ``broker`` (started with ``metrics.port=0``): unlabelled series by name, the
    labelled ones summed."""
    assert broker.data_dir is not None
    address = (broker.data_dir / "metrics-address").read_text().strip()
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$", line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
    return out


def create_compacted(bootstrap: str, topic: str, config: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, **kafka.QUIET})
    futures = admin.create_topics([NewTopic(topic, 1, 1, config=config)], request_timeout=60)
    futures[topic].result(60)


def fill_compacted(bootstrap: str, topic: str, nbytes: int, pool: list[bytes]) -> int:
    """``nbytes`` of records (values from ``pool``) over ``KEYS`` keys; returns the record count."""
    records = max(KEYS, nbytes // len(pool[0]))
    errors: list[str] = []

    def report(err: Any, _msg: Any) -> None:
        if err is not None and len(errors) < 5:
            errors.append(str(err))

    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 10,
            "batch.size": 1_000_000,
            "enable.idempotence": True,
            **kafka.QUIET,
        }
    )
    for i in range(records):
        for _ in range(1000):
            try:
                p.produce(topic, pool[i % len(pool)], key=b"key-%06d" % (i % KEYS), on_delivery=report)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    if p.flush(120) != 0 or errors:
        raise RuntimeError(f"fill of {topic} failed: {errors or 'flush timed out'}")
    return records


def backlog_broker(
    ctx: Context, work: Path, nbytes: int, value_size: int, *, control: bool = False
) -> tuple[BrokerProcess, int, BrokerProcess | None]:
    """A broker on ``work/data`` with a compacted topic holding ``nbytes`` never cleaned, restarted
    with the cleaner on: its first pass starts right away. With ``control``, also a copy of that
    data dir served by a second broker with the cleaner off (the same backlog, just restarted)."""
    data = work / "data"
    off = brokers.start_exactly(data, [*ctx.broker_options, "log.cleaner.enable=false"], log_name="fill.log")
    try:
        create_compacted(
            off.bootstrap, COMPACT_TOPIC, {"cleanup.policy": "compact", "segment.bytes": str(4 * 1024 * 1024)}
        )
        records = fill_compacted(off.bootstrap, COMPACT_TOPIC, nbytes, ctx.pool_for(value_size))
    finally:
        off.stop()
    # The fill's data is still dirty in the page cache: written back during the first half minute
    # or so, it would weigh on whatever is measured then (the broker's appends wait behind the
    # file system's journal) and not on later windows. Write it out before the broker starts.
    os.sync()
    twin: BrokerProcess | None = None
    if control:
        shutil.copytree(data, work / "control")
        twin = brokers.start_exactly(
            work / "control",
            [*ctx.broker_options, "log.cleaner.enable=false", "metrics.port=0"],
            log_name="control.log",
        )
    on = brokers.start_exactly(
        data,
        [*ctx.broker_options, "log.cleaner.backoff.ms=100", "metrics.port=0"],
        log_name="cleaner.log",
    )
    return on, records, twin


def warm_coordinator(bootstrap: str, topic: str) -> None:
    """Ask for a group's committed offset once, so the broker has created ``__consumer_offsets``
    and loaded its coordinator before anything is measured."""
    c = kafka.consumer(bootstrap)
    try:
        c.committed([TopicPartition(topic, 0)], timeout=60)
    finally:
        c.close()


def wait_passes(broker: BrokerProcess, passes: int, timeout: float) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        m = scrape(broker)
        if m.get("exactly_log_cleaner_passes_total", m.get("exactly_log_cleaner_passes", 0)) >= passes:
            return m
        if time.monotonic() > deadline:
            raise RuntimeError(f"the cleaner made fewer than {passes} passes in {timeout:.0f} s")
        time.sleep(0.1)


def passes_of(m: dict[str, float]) -> float:
    return m.get("exactly_log_cleaner_passes_total", m.get("exactly_log_cleaner_passes", 0.0))


def bytes_read_of(m: dict[str, float]) -> float:
    return m.get("exactly_log_cleaner_bytes_read_total", m.get("exactly_log_cleaner_bytes_read", 0.0))


@register
class CleanerThroughput(Workload):
    name = "cleaner-throughput"
    kind = "compaction"
    title = "log cleaner throughput, one pass over a compacted 1-partition backlog, no other load"
    targets = ()
    peer_ok = False
    own_broker = True
    default = False
    value_size = 1000

    def backlog_bytes(self, ctx: Context) -> int:
        return (20 if ctx.quick else 100) * 1_000_000

    def run_once(self, ctx: Context, broker: BrokerProcess | None, state: Any, rep: int) -> dict[str, Any]:
        work = Path(ctx.scratch) / f"cleaner-{uuid.uuid4().hex[:6]}"
        l0 = load1()
        b, records, _ = backlog_broker(ctx, work, self.backlog_bytes(ctx), self.value_size)
        try:
            cpu0 = b.cpu_seconds()
            m = wait_passes(b, 1, 1800)
            cpu = b.cpu_seconds() - cpu0
        finally:
            b.stop()
            shutil.rmtree(work, ignore_errors=True)
        read, written = bytes_read_of(m), m.get("exactly_log_cleaner_bytes_written_total", 0.0)
        pass_s = m.get("exactly_log_cleaner_max_clean_time_seconds", 0.0)
        return {
            "ok": read > 0 and pass_s > 0,
            "passes": passes_of(m),
            "error": "" if read > 0 else "the pass read nothing",
            "records": records,
            "pass_s": pass_s,
            "mb_read": read / MB,
            "mb_written": written / MB,
            "value_bytes": self.value_size,
            "cleaner_mb_s": read / MB / pass_s if pass_s else None,
            "broker_cpu_s": cpu,
            "load1": (l0 + load1()) / 2,
        }


@register
class CleanerThroughput100b(CleanerThroughput):
    """As ``cleaner-throughput`` with 100 B values (offset-commit-sized records: per-record costs)."""

    name = "cleaner-throughput-100b"
    title = "log cleaner throughput, 100 B records"
    value_size = 100

    def backlog_bytes(self, ctx: Context) -> int:
        return (5 if ctx.quick else 20) * 1_000_000


# ------------------------------------------------------------------------------ internal topics


class Wire:
    """One connection to a single broker (every coordinator is that broker)."""

    #: OffsetFetch v8 batches groups; the single-group form (v7) is what this needs
    MAX_VERSIONS = {int(ApiKey.OFFSET_FETCH): 7}

    def __init__(self, bootstrap: str) -> None:
        self.client = WireClient.connect(bootstrap, timeout=30)
        self.versions: dict[int, int] = {}

    def call(self, api: int, **fields: Any) -> Any:
        version = self.versions.get(api)
        if version is None:
            version = self.versions[api] = self.client.version_for(api, self.MAX_VERSIONS.get(int(api)))
        return self.client.call(api, version, **fields)

    def module(self, api: int) -> Any:
        if api not in self.versions:
            self.versions[api] = self.client.version_for(api, self.MAX_VERSIONS.get(int(api)))
        return self.client.module(api, self.versions[api])

    def close(self) -> None:
        self.client.close()


def _check(code: Any, what: str) -> str:
    name = error_name(int(code))
    if name not in ("NONE", "CONCURRENT_TRANSACTIONS", "COORDINATOR_LOAD_IN_PROGRESS"):
        raise RuntimeError(f"{what}: {name}")
    return name


def offset_commits(
    w: Wire, commits: int, groups: int, topic: str, partitions: int = 100, *, start: int = 0
) -> None:
    """``commits`` OffsetCommit entries, 100 partitions per request, round-robin over ``groups``;
    ``start``: the index of the first request (request ``i`` commits offset ``i``), so a load can be
    written in slices."""
    mod = w.module(ApiKey.OFFSET_COMMIT)
    requests = commits // partitions
    for i in range(start, start + requests):
        group = f"group-{i % groups}"
        parts = tuple(
            build(
                mod.OffsetCommitRequestPartition, partition_index=p, committed_offset=i, committed_metadata=""
            )
            for p in range(partitions)
        )
        topics = (build(mod.OffsetCommitRequestTopic, name=topic, partitions=parts),)
        r = w.call(
            ApiKey.OFFSET_COMMIT,
            group_id=group,
            generation_id_or_member_epoch=-1,
            member_id="",
            topics=topics,
        )
        for t in r.topics:
            for p in t.partitions:
                _check(p.error_code, "OffsetCommit")


def transactions(
    w: Wire,
    count: int,
    tids: int,
    topic: str,
    *,
    start: int = 0,
    producers: dict[int, tuple[int, int]] | None = None,
) -> None:
    """``count`` transactions (AddOffsetsToTxn, TxnOffsetCommit, EndTxn commit), round-robin over
    ``tids`` transactional ids, each with a group of its own. ``start`` and ``producers`` (the
    ids' producer id and epoch, filled in here) let a load be written in slices."""
    mod = w.module(ApiKey.TXN_OFFSET_COMMIT)
    if producers is None:
        producers = {}
    for i in range(start, start + count):
        n = i % tids
        tid, group = f"txn-{n}", f"txn-group-{n}"
        if n not in producers:
            r = w.call(
                ApiKey.INIT_PRODUCER_ID,
                transactional_id=tid,
                transaction_timeout=datetime.timedelta(seconds=60),
                producer_id=-1,
                producer_epoch=-1,
            )
            _check(r.error_code, "InitProducerId")
            producers[n] = (int(r.producer_id), int(r.producer_epoch))
        pid, epoch = producers[n]
        for _ in range(1000):
            r = w.call(
                ApiKey.ADD_OFFSETS_TO_TXN,
                transactional_id=tid,
                producer_id=pid,
                producer_epoch=epoch,
                group_id=group,
            )
            if _check(r.error_code, "AddOffsetsToTxn") == "NONE":
                break
            time.sleep(0.001)
        part = build(
            mod.TxnOffsetCommitRequestPartition,
            partition_index=0,
            committed_offset=i,
            committed_leader_epoch=-1,
            committed_metadata="",
        )
        topics = (build(mod.TxnOffsetCommitRequestTopic, name=topic, partitions=(part,)),)
        r = w.call(
            ApiKey.TXN_OFFSET_COMMIT,
            transactional_id=tid,
            group_id=group,
            producer_id=pid,
            producer_epoch=epoch,
            generation_id=-1,
            member_id="",
            group_instance_id=None,
            topics=topics,
        )
        for t in r.topics:
            for p in t.partitions:
                _check(p.error_code, "TxnOffsetCommit")
        r = w.call(
            ApiKey.END_TXN, transactional_id=tid, producer_id=pid, producer_epoch=epoch, committed=True
        )
        _check(r.error_code, "EndTxn")


def internal_bytes(data: Path) -> dict[str, int]:
    out = {"__consumer_offsets": 0, "__transaction_state": 0}
    for d in data.iterdir() if data.exists() else ():
        for prefix in out:
            if d.is_dir() and d.name.startswith(prefix + "-"):
                out[prefix] += sum(f.stat().st_size for f in d.glob("*.log"))
    return out


def ready_s(b: BrokerProcess, group: str | None, expected: int | None, timeout: float = 600) -> float:
    """Seconds from the process start to: OffsetFetch of ``group`` answers (with ``expected`` as
    partition 0's offset, when given) and InitProducerId of a new transactional id succeeds."""
    deadline = time.monotonic() + timeout
    w = Wire(b.bootstrap)
    try:
        mod = w.module(ApiKey.OFFSET_FETCH)
        group_ok = group is None
        while time.monotonic() < deadline:
            if not group_ok:
                topic = build(mod.OffsetFetchRequestTopic, name="bench-offsets", partition_indexes=(0,))
                r = w.call(ApiKey.OFFSET_FETCH, group_id=group, topics=(topic,), require_stable=False)
                if not int(r.error_code):
                    got = [int(p.committed_offset) for t in r.topics for p in t.partitions]
                    group_ok = expected is None or got == [expected]
            if group_ok:
                r = w.call(
                    ApiKey.INIT_PRODUCER_ID,
                    transactional_id=f"probe-{uuid.uuid4().hex[:8]}",
                    transaction_timeout=datetime.timedelta(seconds=60),
                    producer_id=-1,
                    producer_epoch=-1,
                )
                if not int(r.error_code):
                    return time.monotonic() - b.started_at
            time.sleep(0.01)
    finally:
        w.close()
    raise RuntimeError(f"not ready within {timeout:.0f} s")


@register
class InternalTopicsCompaction(Workload):
    name = "compaction-internal"
    kind = "compaction"
    title = "internal topics after many offset commits and transactions: size and restart, cleaner on vs off"
    targets = (
        Target("size_ratio", "<=", 0.05, "of uncompacted size (internal topics, cleaner on / off)", "#11"),
        Target("restart_ratio", "<=", 2.0, "x a fresh broker's restart (cleaner on)", "#11"),
    )
    peer_ok = False
    own_broker = True
    default = False

    def shape(self, ctx: Context) -> dict[str, int]:
        if ctx.quick:
            return {
                "commits": 100_000,
                "transactions": 5_000,
                "groups": 20,
                "tids": 2000,
                "segment": 128 * 1024,
            }
        return {
            "commits": 1_000_000,
            "transactions": 100_000,
            "groups": 20,
            "tids": 2000,
            "segment": 1024 * 1024,
        }

    extra_options: tuple[str, ...] = ()

    def write_load(self, w: Wire, shape: dict[str, int], sample: dict[str, Any], v: str) -> None:
        """The load of one broker (``v``: on / off): all the offset commits, then all the
        transactions, as fast as the broker takes them."""
        t0 = time.perf_counter()
        offset_commits(w, shape["commits"], shape["groups"], "bench-offsets")
        sample[f"{v}_commit_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        transactions(w, shape["transactions"], shape["tids"], "bench-offsets")
        sample[f"{v}_txn_s"] = time.perf_counter() - t0

    def options(self, ctx: Context, segment: int) -> list[str]:
        return [
            *ctx.broker_options,
            *self.time_options(ctx),
            *self.extra_options,
            "offsets.topic.num.partitions=1",
            "transaction.state.log.num.partitions=1",
            f"offsets.topic.segment.bytes={segment}",
            f"transaction.state.log.segment.bytes={segment}",
            "log.cleaner.backoff.ms=200",
            "metrics.port=0",
        ]

    def time_options(self, ctx: Context) -> list[str]:
        """Broker settings that depend on how fast the load's time runs (none here)."""
        return []

    def run_once(self, ctx: Context, broker: BrokerProcess | None, state: Any, rep: int) -> dict[str, Any]:
        shape = self.shape(ctx)
        work = Path(ctx.scratch) / f"internal-{uuid.uuid4().hex[:6]}"
        opts = self.options(ctx, shape["segment"])
        variants = {"on": opts, "off": [*opts, "log.cleaner.enable=false"]}
        sample: dict[str, Any] = {"ok": True, "error": "", **shape}
        loads = [load1()]
        procs: dict[str, BrokerProcess] = {}
        try:
            for v, o in variants.items():
                procs[v] = brokers.start_exactly(work / v / "data", o, log_name="first.log")
                kafka.create_topic(procs[v].bootstrap, "bench-offsets", 100)

            def load(v: str) -> None:
                w = Wire(procs[v].bootstrap)
                try:
                    self.write_load(w, shape, sample, v)
                finally:
                    w.close()

            failures: list[BaseException] = []

            def guarded(v: str) -> None:
                try:
                    load(v)
                except BaseException as exc:  # reported in the sample
                    failures.append(exc)

            threads = [threading.Thread(target=guarded, args=(v,)) for v in variants]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if failures:
                raise failures[0]
            loads.append(load1())
            # the cleaner settles: no pass for 3 back-offs in a row
            last, quiet_since, deadline = -1.0, time.monotonic(), time.monotonic() + 1800
            while time.monotonic() < deadline:
                p = passes_of(scrape(procs["on"]))
                if p != last:
                    last, quiet_since = p, time.monotonic()
                elif time.monotonic() - quiet_since > 3.0:
                    break
                time.sleep(0.2)
            sample["on_passes"] = last
            last_group = f"group-{(shape['commits'] // 100 - 1) % shape['groups']}"
            expected = shape["commits"] // 100 - 1
            for v in variants:
                sizes = internal_bytes(work / v / "data")
                sample[f"{v}_offsets_bytes"] = sizes["__consumer_offsets"]
                sample[f"{v}_txn_state_bytes"] = sizes["__transaction_state"]
                sample[f"{v}_bytes"] = sum(sizes.values())
                sample[f"{v}_offsets_kb"] = sizes["__consumer_offsets"] / 1e3
                sample[f"{v}_txn_state_kb"] = sizes["__transaction_state"] / 1e3
                sample[f"{v}_kb"] = sum(sizes.values()) / 1e3
                procs[v].stop()
            for v in variants:
                procs[v] = brokers.start_exactly(
                    work / v / "data", variants[v], log_name="restart.log", timeout=600
                )
                sample[f"{v}_listen_s"] = procs[v].ready_s
                sample[f"{v}_restart_s"] = ready_s(procs[v], last_group, expected)
                procs[v].stop()
            fresh = brokers.start_exactly(work / "fresh" / "data", opts, log_name="fresh.log")
            sample["fresh_listen_s"] = fresh.ready_s
            sample["fresh_restart_s"] = ready_s(fresh, None, None)
            fresh.stop()
            loads.append(load1())
            procs.clear()
        except Exception as exc:
            sample["ok"], sample["error"] = False, f"{type(exc).__name__}: {exc}"[:1000]
            for p in procs.values():
                p.stop()
        finally:
            shutil.rmtree(work, ignore_errors=True)
        sample["load1"] = sum(loads) / len(loads)
        sample["load1_max"] = max(loads)
        if sample.get("off_bytes"):
            sample["size_ratio"] = sample["on_bytes"] / sample["off_bytes"]
        if sample.get("fresh_restart_s"):
            sample["restart_ratio"] = sample["on_restart_s"] / sample["fresh_restart_s"]
            sample["off_restart_ratio"] = sample["off_restart_s"] / sample["fresh_restart_s"]
        return sample


@register
class InternalTopicsCompactionAged(InternalTopicsCompaction):
    """``compaction-internal`` with ``log.cleaner.delete.retention.ms=1000``: the shape of a broker
    whose history is mostly older than ``delete.retention.ms`` (24 h by default). With the default,
    every COMMIT marker of the run's transactions must stay in ``__consumer_offsets`` for a day
    after its offsets were cleaned (Kafka's rule, so a follower or a reader far behind still sees
    the transaction decided), and each is a batch of its own: 100,000 of them are most of what a
    cleaned ``__consumer_offsets`` holds right after the load. On a broker running for a month,
    only the last day's markers are left."""

    name = "compaction-internal-aged"
    title = "internal topics as compaction-internal, markers and tombstones past delete.retention.ms"
    extra_options = ("log.cleaner.delete.retention.ms=1000",)
