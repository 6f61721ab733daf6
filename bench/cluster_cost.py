#!/usr/bin/env python3
"""Where an RF 3 cluster's CPU per byte goes, broker by broker.

    PYTHONPATH=src .venv/bin/python bench/cluster_cost.py [--records N] [--rounds R] [--rf 3]
        [--perf | --strace | --cprofile] [--client wire]

ZooKeeper + 3 brokers from this checkout's ``src`` (``benchlib.cluster``, broker 0 leads), then R
rounds of ``cluster-produce-p1``'s produce loop (1 KB records, acks=all, 1 MB batches) to a fresh
topic each. Per round and broker: user and system CPU-s per 10^9 record bytes and voluntary /
involuntary context switches per MB (``/proc/<pid>/status``: wake-ups and preemptions). During the
last round, optionally, on every broker:

- ``--perf``: ``perf record -g`` (software cpu-clock, kernel and native frames; Python frames show
  as libpython), then the share of kernel / libpython / other per broker and the top symbols;
- ``--strace``: ``strace -c`` (system calls per round: divide by the rounds' batches);
- ``--cprofile``: a CPU-time cProfile of each broker's event loop (``benchlib/cprofile_site``;
  call counts per round are exact, times are inflated by the profiler's own clock reads).

``--sched-batch`` alternates the rounds between the normal policy and SCHED_BATCH for every broker
thread (``chrt -a -b``: a woken broker does not preempt the running task; a diagnostic of what
wake-up preemption costs on 2 cores, not a recommended setting: it may delay answers).

Output files go to ``--out`` (default a temporary directory, printed). Measured figures and their
reading: ``results/cluster-cost-s15.md``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from benchlib import batch_producer, drivers  # noqa: E402
from benchlib.cluster import DEFAULT_SESSION_TIMEOUT_MS, Cluster  # noqa: E402
from benchlib.cluster_workloads import _place  # noqa: E402
from benchlib.workloads import Context, fixed_rate_latency  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu(pid: int) -> tuple[float, float]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK


def switches(pid: int) -> tuple[int, int]:
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    return int(status["voluntary_ctxt_switches"]), int(status["nonvoluntary_ctxt_switches"])


def tracer(kind: str, pid: int, stem: Path) -> list[str]:
    if kind == "perf":
        return [
            "perf",
            "record",
            "-F",
            os.environ.get("PERF_FREQ", "499"),
            "-g",
            "-p",
            str(pid),
            "-o",
            f"{stem}.perf.data",
        ]
    return ["strace", "-c", "-f", "-p", str(pid), "-o", f"{stem}.strace.txt"]


def perf_summary(data: Path) -> str:
    def report(sort: str, limit: int) -> list[str]:
        out = subprocess.run(
            ["perf", "report", "-i", str(data), "--stdio", "--no-children", "--sort", sort, "-g", "none"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        return [line.strip() for line in out.splitlines() if line.strip()[:1].isdigit()][:limit]

    return "  " + "; ".join(report("dso", 3)) + "\n    " + "\n    ".join(report("symbol", 8))


def stop_tracers(trace: str | None, pids: list[int], tracers: list[subprocess.Popen[bytes]]) -> None:
    if trace == "cprofile":
        for pid in pids:
            os.kill(pid, signal.SIGUSR2)
    for t in tracers:
        t.send_signal(signal.SIGINT)
    for t in tracers:
        t.wait(120)


def latency_ctx(out: Path, pool: list[bytes], seconds: float) -> Context:
    return Context(
        quick=False,
        records=0,
        repeat=1,
        scratch=out,
        kcat_env={},
        latency_seconds=seconds,
        latency_rate=1000,
        recovery_bytes=0,
        broker_options=[],
        pool=pool,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rf", type=int, default=3)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--perf", action="store_const", const="perf", dest="trace")
    mode.add_argument("--strace", action="store_const", const="strace", dest="trace")
    mode.add_argument("--cprofile", action="store_const", const="cprofile", dest="trace")
    ap.add_argument(
        "--client",
        choices=("confluent", "wire"),
        default="confluent",
        help="load generator: confluent-kafka (default) or the blocking idempotent wire producer",
    )
    ap.add_argument(
        "--latency",
        type=float,
        metavar="S",
        help="instead of the produce loop: cluster-latency-1k's 1,000 msg/s loop for S seconds per round"
        " (per-broker CPU in µs per record)",
    )
    ap.add_argument("--sched-batch", action="store_true", help="odd rounds under SCHED_BATCH (see above)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="cluster-cost-"))
    out.mkdir(parents=True, exist_ok=True)
    if args.trace == "cprofile":  # the brokers inherit both
        os.environ["EXACTLY_CPROFILE"] = str(out / "cprofile-{pid}")
        os.environ["PYTHONPATH"] = str(BENCH / "benchlib" / "cprofile_site")
    src = BENCH.parent / "src"
    cluster = Cluster(out / "cluster", 3, DEFAULT_SESSION_TIMEOUT_MS, {}, src=src).start()
    pool = drivers.payload_pool()
    try:
        warm = _place(cluster, "cost-warmup", 1)
        pids = [b.pid for b in cluster.brokers if b.pid is not None]
        for rnd in range(args.rounds):
            topic = _place(cluster, "cost", args.rf)
            policy = "normal"
            if args.sched_batch:
                policy = "batch" if rnd % 2 else "normal"
                for pid in pids:
                    flag = "-b" if rnd % 2 else "-o"
                    subprocess.run(
                        ["chrt", "-a", flag, "-p", "0", str(pid)], check=True, stdout=subprocess.DEVNULL
                    )
            tracers: list[subprocess.Popen[bytes]] = []
            last = rnd == args.rounds - 1
            if last and args.trace in ("perf", "strace"):
                for i, pid in enumerate(pids):
                    cmd = tracer(args.trace, pid, out / f"broker{i}")
                    tracers.append(
                        subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    )
                time.sleep(1)
            if last and args.trace == "cprofile":
                for pid in pids:
                    os.kill(pid, signal.SIGUSR1)
            ready = (
                batch_producer.BatchProducerProcess(cluster.brokers[0].bootstrap, topic, args.records, 600)
                if args.client == "wire"
                else None
            )
            cs0, cpu0 = [switches(p) for p in pids], [cpu(p) for p in pids]
            if args.latency:
                lat = fixed_rate_latency(latency_ctx(out, pool, args.latency), cluster, topic)
                cpu1, cs1 = [cpu(p) for p in pids], [switches(p) for p in pids]
                stop_tracers(args.trace if last else None, pids, tracers)
                n = lat["records"]
                parts = "  ".join(
                    f"b{i} user {(b[0] - a[0]) / n * 1e6:.0f} sys {(b[1] - a[1]) / n * 1e6:.0f}"
                    f" ctx/rec {(d[0] - c[0]) / n:.1f}+{(d[1] - c[1]) / n:.1f}"
                    for i, (a, b, c, d) in enumerate(zip(cpu0, cpu1, cs0, cs1, strict=True))
                )
                total_us = sum(b[0] - a[0] + b[1] - a[1] for a, b in zip(cpu0, cpu1, strict=True)) / n * 1e6
                print(
                    f"round {rnd} latency rf {args.rf}: ack p50 {lat['ack_p50_ms']:.2f} p99 {lat['ack_p99_ms']:.2f} ms,"
                    f" {total_us:.0f} µs CPU/record;  {parts};  load {os.getloadavg()[0]:.1f}"
                    f"{'  errors ' + lat['error'] if not lat['ok'] else ''}",
                    flush=True,
                )
                cluster.delete_topic(topic)
                continue
            if ready is not None:
                run = ready.go()
            else:
                run = drivers.confluent_produce(
                    cluster.bootstrap, topic, args.records, pool, 600, warmup_topic=warm
                )
            cpu1, cs1 = [cpu(p) for p in pids], [switches(p) for p in pids]
            stop_tracers(args.trace if last else None, pids, tracers)
            gb, mb = run.bytes / 1e9, run.bytes / 1e6
            total = sum(b[0] - a[0] + b[1] - a[1] for a, b in zip(cpu0, cpu1, strict=True)) / gb
            parts = "  ".join(
                f"b{i} user {(b[0] - a[0]) / gb:.2f} sys {(b[1] - a[1]) / gb:.2f}"
                f" ctx/MB {(d[0] - c[0]) / mb:.1f}+{(d[1] - c[1]) / mb:.1f}"
                for i, (a, b, c, d) in enumerate(zip(cpu0, cpu1, cs0, cs1, strict=True))
            )
            print(
                f"round {rnd} rf {args.rf} {policy} {args.client}: {mb / run.wall_s:.0f} MB/s, {total:.2f} CPU-s/GB;  {parts};"
                f"  load {os.getloadavg()[0]:.1f}{'  errors ' + str(run.errors[:2]) if run.errors else ''}",
                flush=True,
            )
            cluster.delete_topic(topic)
    finally:
        cluster.stop()
    if args.trace == "perf":
        for i in range(len(pids)):
            print(f"broker {i} (perf, last round):\n{perf_summary(out / f'broker{i}.perf.data')}")
    print(f"files: {out}")


if __name__ == "__main__":
    main()
