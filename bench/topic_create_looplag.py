"""Does creating topics stall a serving broker's event loop? (mends-s21, item 3)

One broker (this checkout's ``src``, or ``--src``) runs with the loop-lag monitor
(``benchlib/looplag_site``, threshold ``--lag-ms``) while the client, in phases, (1) idles,
(2) creates ``--topics`` topics in one CreateTopics request, (3) creates as many one request
each, (4) produces one record to as many new topic names (auto-creation through Metadata).
Per phase: the late loop turns (count, sum, max ms) seen between its start and 0.2 s after its
end, on the client's clock (CLOCK_MONOTONIC, as the monitor's). Topic creation writes the
leader-epoch checkpoint, topics.json and the recovery-point checkpoint durably on the loop.

Ad-hoc tool::

    PYTHONPATH=src:bench .venv/bin/python bench/topic_create_looplag.py --rounds 3
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import brokers, kafka

SITE = Path(__file__).resolve().parent / "benchlib" / "looplag_site"
LAG = re.compile(r"^lag (?P<ts>[\d.]+) ms (?P<ms>[\d.]+)")


def late_turns(stem: str, t0: float, t1: float) -> list[float]:
    out: list[float] = []
    for path in Path(stem).parent.glob(Path(stem).name + "-*.log"):
        for line in path.read_text().splitlines():
            m = LAG.match(line)
            if m and t0 <= float(m["ts"]) <= t1:
                out.append(float(m["ms"]))
    return out


def create(a: AdminClient, names: list[str]) -> None:
    futs = a.create_topics([NewTopic(n, 1, 1) for n in names], operation_timeout=30)
    for f in futs.values():
        f.result(30)


def create_one_by_one(a: AdminClient, names: list[str]) -> None:
    for name in names:
        create(a, [name])


def auto_create(bootstrap: str, names: list[str]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", **kafka.QUIET})
    errors: list[str] = []
    for name in names:
        p.list_topics(name, timeout=30)  # a Metadata request that auto-creates it
        p.produce(name, b"x", on_delivery=lambda e, _m: e and errors.append(str(e)))
    if p.flush(60) != 0 or errors:
        raise RuntimeError(f"auto-created produce not acked: {errors[:3]}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topics", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lag-ms", type=float, default=2.0)
    ap.add_argument("--src", type=Path, default=None)
    args = ap.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="topic-looplag-"))
    stem = str(scratch / "looplag")
    os.environ["EXACTLY_LOOPLAG"] = stem
    os.environ["EXACTLY_LOOPLAG_MS"] = str(args.lag_ms)
    os.environ["PYTHONPATH"] = f"{SITE}:{os.environ.get('PYTHONPATH', '')}"
    b = brokers.start_exactly(scratch / "data", src=args.src)
    del os.environ["EXACTLY_LOOPLAG"]
    rows: list[tuple[str, int, list[float], float]] = []
    try:
        a = kafka.admin(b.bootstrap)
        a.list_topics(timeout=10)
        time.sleep(1.0)
        for rnd in range(args.rounds):
            tag = uuid.uuid4().hex[:6]
            phases: list[tuple[str, Callable[[], None]]] = [
                ("idle 2 s", partial(time.sleep, 2.0)),
                (
                    f"{args.topics} topics, one CreateTopics",
                    partial(create, a, [f"batch-{tag}-{i}" for i in range(args.topics)]),
                ),
                (
                    f"{args.topics} CreateTopics, one topic each",
                    partial(create_one_by_one, a, [f"single-{tag}-{i}" for i in range(args.topics)]),
                ),
                (
                    f"auto-creation by produce to {args.topics} new topics",
                    partial(auto_create, b.bootstrap, [f"auto-{tag}-{i}" for i in range(args.topics)]),
                ),
            ]
            for name, body in phases:
                t0 = time.perf_counter()
                body()
                t1 = time.perf_counter()
                time.sleep(0.3)
                rows.append((name, rnd, late_turns(stem, t0, t1 + 0.2), t1 - t0))
    finally:
        b.stop()
    print(f"late turns >= {args.lag_ms} ms of the broker's loop (load {os.getloadavg()[0]:.1f})")
    print("| phase | round | wall s | late turns | sum ms | max ms |")
    print("|---|---|---|---|---|---|")
    for name, rnd, lags, wall in rows:
        print(f"| {name} | {rnd} | {wall:.2f} | {len(lags)} | {sum(lags):.1f} | {max(lags, default=0):.1f} |")
    for name in dict.fromkeys(r[0] for r in rows):
        maxes = [max(r[2], default=0.0) for r in rows if r[0] == name]
        print(
            f"{name}: max late turn median {statistics.median(maxes):.1f} ms ({min(maxes):.1f}-{max(maxes):.1f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
