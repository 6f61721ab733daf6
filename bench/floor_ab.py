#!/usr/bin/env python3
"""The broker beside the bare receive path (``floor_server.py``), alternating, in one session.

    .venv/bin/python bench/floor_ab.py [--only produce-confluent-100b-p1 produce-kcat-p1] [--reps 4]
        [--records 3000000] [--base OTHER/src]

Why: on this shared box only figures taken minutes apart under the same load compare. Every
repetition runs the workload once on each target, in an order rotated per repetition: the
broker (this checkout's ``src``, or ``--base``), the floor with fresh pages (a new file per run,
the previous one deleted, as the broker's runs do) and the floor overwriting one cached file
(``--pages recycle``). Broker CPU-s/GB is measured as ``run.py``/``ab.py`` measure it (process
CPU around the producer). Prints medians (min-max) per target and figure, and the per-repetition
ratios broker / floor-fresh and floor-fresh / floor-recycle.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "src"))

from benchlib import brokers, drivers, procstat
from benchlib.brokers import BrokerProcess
from benchlib.workloads import REGISTRY, Context

BENCH = Path(__file__).resolve().parent
FIGURES = ("broker_cpu_s_per_gb", "mb_s", "broker_cores")


class FloorContext(Context):
    """Counts a floor's records from its own stats (it keeps no log to ask ListOffsets)."""

    def count_records(self, broker: BrokerProcess, topic: str, partitions: int, size: int = 0) -> int:
        if broker.name.startswith("floor"):
            assert broker.data_dir is not None
            stats = broker.data_dir / "floor-stats.json"
            # the floor writes its stats at each new partition and exit: ask via a no-op topic
            from benchlib import kafka

            probe = f"probe-{topic}"
            kafka.create_topic(broker.bootstrap, probe, 1)
            drivers.confluent_produce(broker.bootstrap, probe, 1, self.pool_for(10), 30)
            got = json.loads(stats.read_text())
            return int(got["records"].get(topic, 0))
        return super().count_records(broker, topic, partitions, size)


def start_floor(scratch: Path, pages: str) -> BrokerProcess:
    data = scratch / f"floor-{pages}"
    log = scratch / f"floor-{pages}.log"
    out = log.open("wb")
    cmd = [sys.executable, str(BENCH / "floor_server.py"), "--data", str(data), "--pages", pages]
    env = {**__import__("os").environ, "PYTHONPATH": str(brokers.REPO / "src")}
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    for _ in range(600):
        text = log.read_text() if log.exists() else ""
        if "listening on" in text:
            bootstrap = text.split("listening on ", 1)[1].split()[0]
            return BrokerProcess(
                f"floor-{pages}", proc, bootstrap, log, started, time.monotonic() - started, data
            )
        if proc.poll() is not None:
            raise RuntimeError(f"floor server exited: {text}")
        time.sleep(0.1)
    raise RuntimeError("floor server did not start")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", default=["produce-confluent-100b-p1", "produce-kcat-p1"])
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--records", type=int, default=3_000_000)
    ap.add_argument("--base", type=Path, help="the broker's src (default this checkout's)")
    ap.add_argument("--out", type=Path, default=BENCH / "results" / "raw")
    args = ap.parse_args(argv)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"stamp": stamp, "workloads": {}}
    with brokers.TempDir("exactly-floor-") as scratch:
        ctx = FloorContext(
            quick=False,
            records=args.records,
            repeat=args.reps,
            scratch=scratch,
            kcat_env=drivers.kcat_env("bundled", scratch),
            latency_seconds=10,
            latency_rate=1000,
            recovery_bytes=0,
            broker_options=[],
            pool=drivers.payload_pool(),
        )
        targets = [
            brokers.start_exactly(scratch / "broker-data", src=args.base.resolve() if args.base else None),
            start_floor(scratch, "fresh"),
            start_floor(scratch, "recycle"),
        ]
        names = ["broker", "floor-fresh", "floor-recycle"]
        load0 = Path("/proc/loadavg").read_text().split()[0]
        try:
            for wname in args.only:
                wl = REGISTRY[wname]()
                print(f"== {wname}", flush=True)
                states = [wl.setup(ctx, t) for t in targets]
                for i, t in enumerate(targets):  # untimed warm-up on each
                    wl.run_once(ctx, t, states[i], -1)
                reps: list[dict[str, dict[str, Any]]] = []
                for rep in range(args.reps):
                    order = list(range(len(targets)))
                    order = order[rep % len(order) :] + order[: rep % len(order)]
                    got: dict[str, dict[str, Any]] = {}
                    for i in order:
                        try:
                            got[names[i]] = wl.run_once(ctx, targets[i], states[i], rep)
                        except Exception as exc:
                            traceback.print_exc()
                            got[names[i]] = {"ok": False, "error": str(exc)[:300]}
                    print(
                        f"   rep {rep}: "
                        + "  ".join(
                            f"{n} {got[n].get('broker_cpu_s_per_gb') or 0:.3f}"
                            f"{'' if got[n].get('ok') else ' FAILED ' + str(got[n].get('error'))[:200]}"
                            for n in names
                        ),
                        flush=True,
                    )
                    reps.append(got)
                results["workloads"][wname] = reps
        finally:
            for t in targets:
                t.stop()
        results["load"] = [load0, Path("/proc/loadavg").read_text().split()[0]]
        results["cpu_ticks"] = procstat.CLK_TCK
    (args.out / f"floor-{stamp}.json").write_text(json.dumps(results, indent=1, default=str))
    print(f"\nload {results['load'][0]} -> {results['load'][1]}")
    print("| workload | figure | " + " | ".join(names) + " |")
    print("| --- | --- |" + " ---: |" * len(names))
    for wname, reps in results["workloads"].items():
        for fig in FIGURES:
            cells = []
            for n in names:
                vals = [r[n][fig] for r in reps if r[n].get("ok") and isinstance(r[n].get(fig), float)]
                cells.append(
                    f"{statistics.median(vals):.3g} ({min(vals):.3g}-{max(vals):.3g})" if vals else "-"
                )
            print(f"| {wname} | {fig} | " + " | ".join(cells) + " |")
        for a, b in (("broker", "floor-fresh"), ("floor-fresh", "floor-recycle")):
            ratios = [
                r[a]["broker_cpu_s_per_gb"] / r[b]["broker_cpu_s_per_gb"]
                for r in reps
                if r[a].get("ok") and r[b].get("ok") and r[b]["broker_cpu_s_per_gb"]
            ]
            if ratios:
                print(
                    f"   {wname}: {a} / {b} CPU-s/GB per rep: median {statistics.median(ratios):.2f} "
                    f"({min(ratios):.2f}-{max(ratios):.2f})"
                )
    print(f"-- raw: {args.out / f'floor-{stamp}.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
