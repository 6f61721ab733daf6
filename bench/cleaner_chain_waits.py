"""Diagnostic for issue #11: per produce ack of a ``cleaner_stall_trace.py`` run (its ``--out``
directory: ``trace.txt`` and ``acks.json``), how long the chain's threads (the broker's, the
client's Python and librdkafka threads) were runnable but not running inside [send, ack], and who
held the CPU they were queued on: the cleaner's ``worker``, another ``chain`` thread, ``other``
processes, or nobody (``idle``: a wake-up not yet served). Printed per window for the median acks
(45th-55th percentile) and the 98th-99th percentile ones. A queued thread is attributed to the
CPU it was woken on (or preempted on); a migration while queued is not followed.

    python3 bench/cleaner_chain_waits.py /tmp/cleaner-stall
"""

from __future__ import annotations

import bisect
import collections
import json
import re
import sys
from pathlib import Path

LINE = re.compile(
    r"^\s*(?P<comm>.+?)-(?P<pid>\d+)\s+\[(?P<cpu>\d+)\]\s+\S+\s+(?P<ts>[\d.]+):\s+"
    r"(?P<ev>sched_switch|sched_wakeup):\s+(?P<rest>.*)$"
)
SWITCH = re.compile(
    r"prev_comm=(?P<pc>.*) prev_pid=(?P<prev>\d+) prev_prio=\d+ prev_state=(?P<st>\S+) "
    r"==> next_comm=(?P<nc>.*) next_pid=(?P<next>\d+)"
)
WAKEUP = re.compile(r"comm=(?P<comm>.*) pid=(?P<pid>\d+) prio=\d+ target_cpu=(?P<cpu>\d+)")
Run = tuple[int, int, str]


def main(out: Path) -> None:
    meta = json.loads((out / "acks.json").read_text())
    worker = int(meta["worker_pid"])
    chain = {int(k) for k, v in meta["watched"].items() if v != "worker"}
    current: dict[int, tuple[int, int]] = {}  # cpu -> (pid, since)
    runs: dict[int, list[Run]] = collections.defaultdict(list)  # cpu -> (start, end, holder)
    queued: dict[int, tuple[int, int]] = {}  # tid -> (since, cpu)
    waits: list[tuple[int, int, int]] = []  # (start, end, cpu)
    with (out / "trace.txt").open() as f:
        for line in f:
            m = LINE.match(line)
            if not m:
                continue
            ts, cpu = round(float(m["ts"]) * 1e9), int(m["cpu"])
            if m["ev"] == "sched_wakeup":
                w = WAKEUP.search(m["rest"])
                if w:
                    tid = int(w["pid"])
                    if w["comm"].startswith("rdk:"):
                        chain.add(tid)
                    if tid in chain and tid not in queued:
                        queued[tid] = (ts, int(w["cpu"]))
                continue
            s = SWITCH.search(m["rest"])
            if not s:
                continue
            prev, nxt = int(s["prev"]), int(s["next"])
            pid0, t0 = current.get(cpu, (-1, ts))
            if pid0 != -1:
                holder = (
                    "worker"
                    if pid0 == worker
                    else "idle"
                    if pid0 == 0
                    else "chain"
                    if pid0 in chain
                    else "other"
                )
                runs[cpu].append((t0, ts, holder))
            current[cpu] = (nxt, ts)
            if s["nc"].startswith("rdk:"):
                chain.add(nxt)
            if prev in chain and s["st"].startswith("R"):
                queued[prev] = (ts, cpu)  # preempted: still runnable
            if nxt in queued:
                since, _cpu = queued.pop(nxt)
                waits.append((since, ts, cpu))
    starts = {c: [r[0] for r in v] for c, v in runs.items()}
    waits.sort()
    wait_starts = [w[0] for w in waits]

    def holders(a: int, b: int, cpu: int, acc: collections.Counter[str]) -> None:
        v = runs.get(cpu, [])
        i = max(bisect.bisect_right(starts.get(cpu, []), a) - 1, 0)
        while i < len(v) and v[i][0] < b:
            lo, hi = max(v[i][0], a), min(v[i][1], b)
            if hi > lo:
                acc[v[i][2]] += (hi - lo) / 1e6
            i += 1

    for window in meta["windows"]:
        rows: list[tuple[float, collections.Counter[str]]] = []
        for send, ack in window["acks"]:
            acc: collections.Counter[str] = collections.Counter()
            i = bisect.bisect_left(wait_starts, send - 5_000_000)
            while i < len(waits) and waits[i][0] < ack:
                a, b, cpu = waits[i]
                lo, hi = max(a, send), min(b, ack)
                if hi > lo:
                    holders(lo, hi, cpu, acc)
                i += 1
            rows.append(((ack - send) / 1e6, acc))
        rows.sort(key=lambda r: r[0])
        n = len(rows)
        print(f"{window['name']:5s} ack p50 {rows[n // 2][0]:.2f} ms, p99 {rows[int(n * 0.99)][0]:.2f} ms")
        for label, part in (
            ("median", rows[int(n * 0.45) : int(n * 0.55)]),
            ("p98-99", rows[int(n * 0.98) : int(n * 0.99)]),
        ):
            total: collections.Counter[str] = collections.Counter()
            for _lat, acc in part:
                total.update(acc)
            per_ack = {k: round(v / len(part), 3) for k, v in total.most_common()}
            print(f"    {label} acks: chain threads queued, ms per ack, by the CPU's holder: {per_ack}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
