#!/usr/bin/env python3
"""Why 100 B records cost more broker CPU per GB than 1 KB: the same bytes in requests of other sizes.

    PYTHONPATH=src .venv/bin/python bench/request_size.py [--reps 4] [--src OTHER/src]

One broker (this checkout's ``src`` or ``--src``; ``metrics.port=0``), four producers of the same
kind of data, each repetition in a rotated order so the neighbours' load falls on all of them:

- ``confluent-100b``: ``produce-confluent-100b-p1``'s producer (confluent-kafka, the workload's
  linger.ms=10), 900k records of 100 B;
- ``confluent-100b-linger100``: the same with linger.ms=100, so librdkafka fills its ~1 MB batches;
- ``kcat-100b``: kcat (C, the same librdkafka) with the same 900k 100 B records;
- ``kcat-1k``: ``produce-kcat-p1``'s run, 300k records of 1 KB.

Per variant: broker CPU-s per GB of record values (the run.py figure, measured the same way:
around the whole driver call), Produce requests per GB and KB per request from the broker's own
``exactly_requests_total{api="Produce"}``, and broker CPU per Produce request. If the CPU per GB
follows requests per GB rather than record size, the per-request cost is what to cut.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import brokers, drivers, kafka, procstat
from benchlib.brokers import BrokerProcess

VARIANTS = ("confluent-100b", "confluent-100b-linger100", "kcat-100b", "kcat-1k")
_PRODUCE = re.compile(r'^exactly_requests_total\{api="Produce"\}\s+(\S+)$', re.M)


def produce_requests(broker: BrokerProcess) -> int:
    assert broker.data_dir is not None
    address = (broker.data_dir / "metrics-address").read_text().strip()
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        m = _PRODUCE.search(response.read().decode())
    return int(float(m.group(1))) if m else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument(
        "--src", type=Path, default=None, help="the broker's package tree (default: this checkout)"
    )
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="request-size-"))
    broker = brokers.start_exactly(scratch / "data", ["metrics.port=0"], src=args.src)
    pool100, pool1k = drivers.payload_pool(100), drivers.payload_pool(1024)
    lines1k = drivers.write_lines_file(scratch / "lines1k.txt", 300_000, pool1k)
    lines100 = drivers.write_lines_file(scratch / "lines100.txt", 900_000, pool100)
    env = dict(os.environ)
    warm = "request-size-warmup"
    kafka.create_topic(broker.bootstrap, warm, 1)
    rows: dict[str, list[tuple[float, int, float]]] = {v: [] for v in VARIANTS}
    try:
        for rep in range(-1, args.reps):  # rep -1: warm-up, not counted
            order = VARIANTS[rep % len(VARIANTS) :] + VARIANTS[: rep % len(VARIANTS)]
            for variant in order:
                topic = f"request-size-{variant}-{rep + 1}"
                kafka.create_topic(broker.bootstrap, topic, 1)
                records, size = (300_000, 1024) if variant == "kcat-1k" else (900_000, 100)
                r0, c0 = produce_requests(broker), procstat.cpu_seconds(broker.pid)
                if variant == "kcat-1k":
                    run = drivers.kcat_produce(broker.bootstrap, topic, lines1k, records, size, 120, env)
                elif variant == "kcat-100b":
                    run = drivers.kcat_produce(broker.bootstrap, topic, lines100, records, size, 120, env)
                else:
                    conf = {"linger.ms": 100} if variant.endswith("linger100") else None
                    run = drivers.confluent_produce(
                        broker.bootstrap, topic, records, pool100, 120, conf=conf, warmup_topic=warm
                    )
                cpu = procstat.cpu_seconds(broker.pid) - c0
                requests = produce_requests(broker) - r0 - (1 if variant.startswith("confluent") else 0)
                kafka.delete_topic(broker.bootstrap, topic)
                if run.errors or run.records != records:
                    print(f"rep {rep} {variant}: failed {run.errors[:2]}", flush=True)
                    continue
                gb = records * size / 1e9
                mbps = records * size / run.wall_s / 1e6
                print(
                    f"rep {rep:2} {variant:25} {cpu / gb:5.2f} CPU-s/GB  {requests / gb:6.0f} req/GB  "
                    f"{records * size / max(requests, 1) / 1e3:5.0f} KB/req  {cpu / max(requests, 1) * 1e6:5.0f} µs/req  "
                    f"{mbps:5.0f} MB/s  load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
                if rep >= 0:
                    rows[variant].append((cpu / gb, requests, cpu / max(requests, 1)))
    finally:
        broker.stop()
    print("\n| variant | broker CPU-s/GB | Produce requests / GB | KB / request | broker µs / request |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for variant, samples in rows.items():
        if not samples:
            continue
        per_gb = statistics.median(s[0] for s in samples)
        req = statistics.median(s[1] for s in samples)
        gb = 0.3072 if variant == "kcat-1k" else 0.09
        us = statistics.median(s[2] for s in samples) * 1e6
        print(f"| {variant} | {per_gb:.2f} | {req / gb:.0f} | {gb * 1e6 / req:.0f} | {us:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
