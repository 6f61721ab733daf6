"""Diagnostic for ``worker.CpuLimiter``'s yield: how long tasks woken onto a core held by a
background burner wait, with the burner yielding at every tick or not.

Two synthetic burners with the cleaner worker's scheduling and duty cycle
(``cleaner_mechanism_ab.BURNER``: ``burn-cpu`` and ``burn-cpuyield``), resumed one at a time in
ABBA order for ``--seconds`` each while ``cleaner_burst_trace`` records the box's switches and
wake-ups; per window, the waits of nice-0 tasks woken on the burner's CPU while it ran (whatever
runs on the box supplies the wake-ups). Needs root (tracefs)::

    PYTHONPATH=src:bench .venv/bin/python bench/cleaner_yield_mech.py --rounds 4 --seconds 8
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
from pathlib import Path

from cleaner_burst_trace import analyse, record
from cleaner_mechanism_ab import start_burner


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--share", type=float, default=0.2)
    args = ap.parse_args(argv)
    src = str(Path(__file__).resolve().parents[1] / "src")
    pythonpath = os.environ.get("PYTHONPATH", src)
    burners = {k: start_burner(args.share, k, pythonpath) for k in ("cpu", "cpuyield")}
    rows = []
    try:
        order = [
            k
            for r in range(args.rounds)
            for k in (("cpu", "cpuyield") if r % 2 == 0 else ("cpuyield", "cpu"))
        ]
        for kind in order:
            pid = burners[kind].pid
            os.kill(pid, signal.SIGCONT)
            with tempfile.TemporaryDirectory() as tmp:
                trace = Path(tmp) / "t.txt"
                try:
                    record(args.seconds, trace, Path(tmp) / "t.tgids")
                finally:
                    os.kill(pid, signal.SIGSTOP)
                res = analyse(trace, pid, args.seconds)
            res["kind"], res["load1"] = kind, os.getloadavg()[0]
            rows.append(res)
            print(
                json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in res.items()}),
                flush=True,
            )
    finally:
        for p in burners.values():
            p.kill()
            p.wait()
    for kind in ("cpu", "cpuyield"):
        rs = [r for r in rows if r["kind"] == kind]
        print(
            kind,
            "wait p99 ms median",
            round(statistics.median(r["wait_ms_p99"] for r in rs), 3),
            "held ms per worker-CPU-s median",
            round(statistics.median(r["held_ms_per_worker_cpu_s"] for r in rs), 1),
            "worker cpu ms/s median",
            round(statistics.median(r["worker_cpu_ms_per_s"] for r in rs), 1),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
