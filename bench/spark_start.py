"""Where a pipeline process's time goes from its start to its first committed micro-batch.

    PYTHONPATH=src .venv/bin/python bench/spark_start.py                  # 3 runs, defaults of the crash tests
    PYTHONPATH=src .venv/bin/python bench/spark_start.py --runs 2 --spark-conf spark.x=y --out /tmp/s.md

One broker of its own (two-phase commit allowed), 2000 orders written once; then ``--runs`` times
``python -m exactly pipeline run`` as the crash tests start it (``local[2]``, availableNow, 700
offsets a trigger, atomic two-phase sink, a fresh checkpoint each run). Each run's timeline, in
seconds from the ``Popen``:

* ``session``: the pipeline printed ``spark <version> master ...`` (JVM up, SparkSession built);
* Spark's event log (``spark.eventLog.enabled``, a directory per run): the query's start, the first
  job's submission and end, the first progress event (batch 0 committed: its commit log written);
  the first batch's ``durationMs`` phases from that progress event;
* the connector's timers (``EXACTLY_SPARK_TIMINGS``): the first Python worker's start-up
  (``worker_start_s``: fork, imports, unpickling) and the sink's set-up per task;
* ``exit``: the process ended (all batches, ``spark.stop()``, the JVM's exit).

The runs are sequential in one set of conditions (``--spark-conf`` applies to all of them): to
compare two settings, run this twice back to back and compare the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from exactly.spark.orders import Topics, create_topics, generate  # noqa: E402
from exactly.spark.timings import ENV as TIMINGS_ENV  # noqa: E402
from exactly.spark.timings import load as load_timings  # noqa: E402
from exactly.testing.broker import Broker, child_env  # noqa: E402


class TreeCpu(threading.Thread):
    """Samples the CPU time of a process and all its descendants (the JVM, its Python daemons and
    workers) every 0.2 s from /proc; a process's last sample counts (one that lives less than
    0.2 s may be missed). The JVM is not waited for by the pipeline process, so ``wait4``'s
    rusage would miss it."""

    def __init__(self, root: int) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.stop = threading.Event()
        self.ticks: dict[tuple[int, int], int] = {}

    def run(self) -> None:
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(0.2)

    def sample(self) -> None:
        parents: dict[int, int] = {}
        stats: dict[int, list[str]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry.name)] = int(fields[1])
            stats[int(entry.name)] = fields
        for pid, fields in stats.items():
            p = pid
            while p in parents and p != self.root:
                p = parents[p]
            if p == self.root:
                self.ticks[(pid, int(fields[19]))] = int(fields[11]) + int(fields[12])

    def cpu_s(self) -> float:
        return sum(self.ticks.values()) / os.sysconf("SC_CLK_TCK")


def event_log(directory: Path) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for path in sorted(x for x in directory.rglob("*") if x.is_file()):
        for line in path.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                events.append(event)
    return events


def first(events: list[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    return next((e for e in events if e.get("Event", "").endswith(kind)), None)


def one_run(bootstrap: str, topics: Topics, work: Path, n: int, extra: list[str]) -> dict[str, Any]:
    ckpt, events, timings = work / f"ckpt-{n}", work / f"events-{n}", work / f"timings-{n}"
    events.mkdir()
    timings.mkdir()
    prefix = topics.orders[: -len("order-completed")]
    cmd = [
        sys.executable, "-m", "exactly", "pipeline", "run", "--bootstrap-server", bootstrap,
        "--topic-prefix", prefix, "--checkpoint", str(ckpt), "--master", "local[2]",
        "--trigger", "availableNow", "--max-offsets-per-trigger", "700", "--shuffle-partitions", "2",
        "--sink-option", "atomicBatches=true", "--transactional-id-prefix", f"start-{n}",
        "--spark-conf", "spark.eventLog.enabled=true", "--spark-conf", f"spark.eventLog.dir=file://{events}",
        "--spark-conf", "spark.eventLog.compress=false",
        *extra,
    ]  # fmt: skip
    env = child_env(extra={TIMINGS_ENV: str(timings)})
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    sampler = TreeCpu(proc.pid)
    sampler.start()
    marks: dict[str, float] = {}
    out: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        out.append(line)
        now = time.time() - t0
        if line.startswith("spark ") and "session" not in marks:
            marks["session"] = now
        if line.startswith("batch ") and "batch_line" not in marks:
            marks["batch_line"] = now
    code = proc.wait()
    marks["exit"] = time.time() - t0
    sampler.stop.set()
    sampler.join()
    cpu_s = sampler.cpu_s()
    if code != 0:
        raise SystemExit(f"pipeline exited {code}:\n{''.join(out)[-4000:]}")
    evs = event_log(events)
    app = first(evs, "SparkListenerApplicationStart")
    qstart = first(evs, "QueryStartedEvent")
    job = first(evs, "SparkListenerJobStart")
    job_end = first(evs, "SparkListenerJobEnd")
    progress = first(evs, "QueryProgressEvent")
    if app:
        marks["app_start"] = app["Timestamp"] / 1000 - t0
    if qstart:
        marks["query_start"] = datetime_s(qstart.get("timestamp")) - t0
    if job:
        marks["first_job_submit"] = job["Submission Time"] / 1000 - t0
    if job_end:
        marks["first_job_end"] = job_end["Completion Time"] / 1000 - t0
    phases: dict[str, Any] = {}
    if progress:
        p = progress["progress"]
        phases = dict(p.get("durationMs") or {})
        marks["batch0_trigger"] = datetime_s(p["timestamp"]) - t0
        marks["batch0_done"] = marks["batch0_trigger"] + phases.get("triggerExecution", 0) / 1000
    lines = load_timings(timings)
    starts = [x["worker_start_s"] for x in lines if "worker_start_s" in x]
    return {
        "t0": t0,
        "cpu_s": cpu_s,
        "marks": marks,
        "phases": phases,
        "worker_start_s": starts,
        "workers": len({x["pid"] for x in lines}),
        "timings": lines,
    }


def datetime_s(text: str | None) -> float:
    from datetime import datetime

    if not text:
        return float("nan")
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--orders", type=int, default=2000)
    ap.add_argument("--spark-conf", action="append", default=[])
    ap.add_argument("--jvm", choices=("quick", "full"), default=None, help="the pipeline's --jvm")
    ap.add_argument("--label", default="")
    ap.add_argument("--out", type=Path, default=None, help="append the report here")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (event logs, timings)")
    ap.add_argument("--json", type=Path, default=None, help="write the raw runs here")
    args = ap.parse_args()
    extra = [x for kv in args.spark_conf for x in ("--spark-conf", kv)]
    if args.jvm:
        extra += ["--jvm", args.jvm]
    work = Path(tempfile.mkdtemp(prefix="exactly-bench-spark-start-"))
    broker = Broker(
        work / "data", work / "broker.log", overrides={"transaction.two.phase.commit.enable": "true"}
    )
    runs: list[dict[str, Any]] = []
    try:
        broker.start()
        topics = Topics.with_prefix(f"start-{os.getpid()}-")
        create_topics(broker.bootstrap, topics, partitions=3)
        generate(broker.bootstrap, topics, args.orders, txn_size=100, abort_every=4, seed=21)
        for n in range(args.runs):
            load = os.getloadavg()[0]
            r = one_run(broker.bootstrap, topics, work, n, extra)
            r["load"] = load
            runs.append(r)
            m = r["marks"]
            print(
                f"run {n}: load {load:.2f} cpu {r['cpu_s']:.1f}s "
                + " ".join(f"{k}={v:.1f}" for k, v in sorted(m.items(), key=lambda kv: kv[1]))
                + f" worker_start={[round(s, 1) for s in r['worker_start_s']]} phases={r['phases']}",
                flush=True,
            )
    finally:
        broker.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    keys = ["session", "query_start", "first_job_submit", "batch0_done", "exit"]
    med = {k: statistics.median(r["marks"].get(k, float("nan")) for r in runs) for k in keys}
    report = [
        f"### spark start {args.label} ({time.strftime('%Y-%m-%d %H:%M')} UTC, {args.runs} runs, "
        f"--jvm {args.jvm or 'default'}, conf {args.spark_conf or 'default'})",
        "",
        "| run | load | CPU-s | session | query start | 1st job | batch 0 committed | exit | batch 0 phases (ms) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n, r in enumerate(runs):
        m = r["marks"]
        report.append(
            f"| {n} | {r['load']:.2f} | {r['cpu_s']:.1f} | "
            + " | ".join(f"{m.get(k, float('nan')):.1f}" for k in keys)
            + f" | {json.dumps(r['phases'])} |"
        )
    cpu = statistics.median(r["cpu_s"] for r in runs)
    report.append(f"| median | | {cpu:.1f} | " + " | ".join(f"{med[k]:.1f}" for k in keys) + " | |")
    text = "\n".join(report) + "\n"
    print(text)
    if args.out:
        with args.out.open("a") as f:
            f.write(text + "\n")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1, default=str))


if __name__ == "__main__":
    main()
