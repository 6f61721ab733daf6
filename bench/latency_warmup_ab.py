"""Paired A/B of ``fixed_rate_latency``'s warm-up record (``workloads.warm_up_producer``): per pair
one short window with it (*after*) and one with it patched out (*before*, the loop until
2026-11-25), order alternating, a fresh producer and topic each, on one plain broker.

What it counts: windows whose first ack took 400-600 ms, the signature of librdkafka's idempotent
producer waiting out its 500 ms producer-id retry timer with the window's first records
(``bench/results/stall-s20.md``); also any ack >= 200 ms (on a loaded box, mostly the load). Short
windows (``--records``) so the window's start dominates. Ad hoc::

    PYTHONPATH=src:bench .venv/bin/python bench/latency_warmup_ab.py --pairs 150
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from benchlib import brokers, drivers, kafka, workloads
from benchlib.workloads import Context


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=150)
    ap.add_argument("--records", type=int, default=50, help="records per window, at 1,000/s")
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "latency-warmup-ab")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    ctx = Context(
        quick=False,
        records=0,
        repeat=1,
        scratch=args.out,
        kcat_env={},
        latency_seconds=args.records / 1000,
        latency_rate=1000,
        recovery_bytes=0,
        broker_options=[],
        pool=drivers.payload_pool(1024),
    )
    warm_up, warm_records = workloads.warm_up_producer, workloads.WARMUP_RECORDS

    def no_warm_up(_p: Any, _topic: str, _pad: bytes) -> None:
        return None

    b = brokers.start_exactly(args.out / f"data-{uuid.uuid4().hex[:6]}")
    res: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
    try:
        for i in range(args.pairs):
            for arm in ("before", "after") if i % 2 == 0 else ("after", "before"):
                workloads.warm_up_producer = no_warm_up if arm == "before" else warm_up
                workloads.WARMUP_RECORDS = 0 if arm == "before" else warm_records
                topic = f"warmup-ab-{uuid.uuid4().hex[:6]}"
                kafka.create_topic(b.bootstrap, topic, 1)
                s = workloads.fixed_rate_latency(ctx, b, topic, keep_acks=True)
                if not s["ok"]:
                    print(f"{arm} {i}: {s['error']}", file=sys.stderr, flush=True)
                acks = s["ack_ms"]
                if acks:
                    res[arm].append((acks[0], max(acks)))
    finally:
        workloads.warm_up_producer, workloads.WARMUP_RECORDS = warm_up, warm_records
        b.stop()
    (args.out / "result.json").write_text(json.dumps(res))
    for arm, rows in res.items():
        firsts = [f for f, _ in rows]
        print(
            f"{arm}: windows {len(rows)}, first ack 400-600 ms {sum(400 <= f <= 600 for f in firsts)}, "
            f"first ack >= 200 ms {sorted(round(f) for f in firsts if f >= 200)}, "
            f"any ack >= 200 ms {sum(m >= 200 for _, m in rows)}, first-ack median {statistics.median(firsts):.1f} ms"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
