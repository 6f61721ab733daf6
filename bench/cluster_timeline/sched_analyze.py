#!/usr/bin/env python3
"""Per acks=all produce, how long each thread of the chain waited for a core (``SCHED_TRACE=1`` runs).

    python bench/cluster_timeline/sched_analyze.py OUT [--stages [--batched]]

From ``sched.txt`` (``sched_trace.py``): each thread's *runnable waits* (woken, or preempted while
runnable, until it runs) and *run* intervals. For every acknowledged record (``client.json``: send
and delivery on CLOCK_MONOTONIC) the time inside [send, delivery] each actor spent waiting and
running: the three brokers' event-loop threads (their main threads), the client's threads (the
producer's and the consumer's librdkafka threads and the Python thread), ZooKeeper (any ``java``
thread) and everything else. Printed for the median acks (45th-55th percentile) and the slowest
1%, with what ran on the cores while a broker loop waited in the slowest 1%.

``--stages`` (a traced copy's run): per stage of ``analyze.py``'s timeline, the time the thread(s)
that move that stage on spent waiting for a core and running, so a slow stage reads as "waited for
a core" (CPU queueing), "ran" (work on that loop, its own or someone else's request) or neither
(blocked: the message was in flight or another process had to act first).
"""

from __future__ import annotations

import bisect
import collections
import json
import re
import statistics
import sys
from pathlib import Path

LINE = re.compile(
    r"^\s*(?P<comm>.+?)-(?P<pid>\d+)\s+(?:\(\s*[\d-]+\)\s+)?\[(?P<cpu>\d+)\]\s+\S+\s+(?P<ts>[\d.]+):\s+(?P<ev>\w+):\s+(?P<rest>.*)$"
)
SWITCH = re.compile(
    r"prev_comm=(?P<pc>.*) prev_pid=(?P<prev>\d+) prev_prio=\d+ prev_state=(?P<st>\S+) ==> next_comm=(?P<nc>.*) next_pid=(?P<next>\d+)"
)
WAKEUP = re.compile(r"comm=(?P<comm>.*) pid=(?P<pid>\d+) prio=")


def intervals(
    path: Path,
) -> tuple[dict[int, list[tuple[int, int]]], dict[int, list[tuple[int, int, int]]], dict[int, str]]:
    """(tid -> runnable waits [(start, end)], cpu -> runs [(start, end, tid)], tid -> comm)."""
    waits: dict[int, list[tuple[int, int]]] = collections.defaultdict(list)
    runs: dict[int, list[tuple[int, int, int]]] = collections.defaultdict(list)
    comm: dict[int, str] = {}
    ready: dict[int, int] = {}
    on: dict[int, tuple[int, int]] = {}
    with path.open() as f:
        for line in f:
            m = LINE.match(line)
            if not m:
                continue
            ts, cpu = round(float(m["ts"]) * 1e9), int(m["cpu"])
            if m["ev"] == "sched_switch":
                s = SWITCH.search(m["rest"])
                if not s:
                    continue
                prev, nxt = int(s["prev"]), int(s["next"])
                comm[prev], comm[nxt] = s["pc"], s["nc"]
                t0 = on.get(cpu)
                if t0 is not None and t0[0] == prev:
                    runs[cpu].append((t0[1], ts, prev))
                if s["st"].startswith("R") and prev:
                    ready[prev] = ts
                on[cpu] = (nxt, ts)
                w = ready.pop(nxt, None)
                if w is not None:
                    waits[nxt].append((w, ts))
            elif m["ev"] == "sched_wakeup":
                w2 = WAKEUP.search(m["rest"])
                if w2:
                    pid = int(w2["pid"])
                    comm[pid] = w2["comm"]
                    ready.setdefault(pid, ts)
    return waits, runs, comm


def overlap(iv: list[tuple[int, int]], starts: list[int], a: int, b: int) -> int:
    i = max(0, bisect.bisect_right(starts, a) - 1)
    total = 0
    while i < len(iv) and iv[i][0] < b:
        s, e = iv[i]
        total += max(0, min(e, b) - max(s, a))
        i += 1
    return total


#: stage -> the actors that move it on (prefixes of the actor names)
MOVERS = {
    "client->frame_in": ("client:rdk", "b0:loop"),
    "write->client_ack": ("client:rdk", "client:py"),
    "f1:resp->follower_frame": ("b1:loop",),
    "f1:frame->appended": ("b1:loop",),
    "f1:appended->send": ("b1:loop",),
    "f2:resp->follower_frame": ("b2:loop",),
    "f2:frame->appended": ("b2:loop",),
    "f2:appended->send": ("b2:loop",),
}


def stages(
    out: Path,
    batched: bool,
    by_actor_w: dict[str, list[tuple[int, int]]],
    by_actor_r: dict[str, list[tuple[int, int]]],
) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from analyze import timeline

    spans, _ = timeline(out, batched)
    spans.sort(key=lambda r: r["TOTAL"][1] - r["TOTAL"][0])
    n = len(spans)
    idx_w = {k: [x[0] for x in v] for k, v in by_actor_w.items()}
    idx_r = {k: [x[0] for x in v] for k, v in by_actor_r.items()}

    def movers(stage: str) -> list[str]:
        want = MOVERS.get(stage, ("b0:loop",))
        return [k for k in set(by_actor_w) | set(by_actor_r) if k.startswith(want)]

    for label, grp in (
        ("median (p45-p55)", spans[int(n * 0.45) : int(n * 0.55)]),
        ("slowest 1%", spans[int(n * 0.99) :]),
    ):
        print(
            f"\n{label}: {len(grp)} records; per stage, mean us: duration | movers waiting for a core | movers running"
        )
        for stage in grp[0]:
            if stage == "TOTAL":
                continue
            ms = movers(stage)
            d = w = r = 0.0
            for row in grp:
                a, b = row[stage]
                d += b - a
                w += min(b - a, sum(overlap(by_actor_w[k], idx_w[k], a, b) for k in ms if k in by_actor_w))
                r += min(b - a, sum(overlap(by_actor_r[k], idx_r[k], a, b) for k in ms if k in by_actor_r))
            g = len(grp) * 1e3
            print(f"  {stage:26s} {d / g:8.0f} | {w / g:8.0f} | {r / g:8.0f}   ({', '.join(sorted(ms))})")


def main() -> None:
    out = Path(sys.argv[1])
    client = json.loads((out / "client.json").read_text())
    threads = json.loads((out / "threads.json").read_text())
    acks = sorted((v[1] - v[0], v[0], v[1]) for v in client["acks"].values())
    waits, runs, comm = intervals(out / "sched.txt")
    actor: dict[int, str] = {}
    for name, rows in threads.items():
        pid = int(rows["pid"])
        for tid, c in rows.items():
            if tid == "pid":
                continue
            t = int(tid)
            if name == "client":
                actor[t] = "client:" + ("py" if t == pid else c.split(":")[0].replace("rdk", "rdk:" + c[4:5]))
            else:
                actor[t] = f"b{name}:" + ("loop" if t == pid else "thr")
    for tid, c in comm.items():
        if tid not in actor:
            actor[tid] = "zk" if c.startswith("java") else ("idle" if tid == 0 else "other")
    by_actor_w: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    for tid, iv in waits.items():
        by_actor_w[actor.get(tid, "other")].extend(iv)
    by_actor_r: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    for iv3 in runs.values():
        for s, e, tid in iv3:
            by_actor_r[actor.get(tid, "other")].append((s, e))
    for d in (by_actor_w, by_actor_r):
        for k in d:
            d[k].sort()
    names = sorted(set(by_actor_w) | set(by_actor_r))
    if "--stages" in sys.argv:
        stages(out, "--batched" in sys.argv, by_actor_w, by_actor_r)
    n = len(acks)
    groups = {"median (p45-p55)": acks[int(n * 0.45) : int(n * 0.55)], "slowest 1%": acks[int(n * 0.99) :]}
    print(f"{n} acks; p50 {acks[n // 2][0] / 1e6:.2f} p99 {acks[int(n * 0.99)][0] / 1e6:.2f} ms")
    for label, grp in groups.items():
        print(f"\n{label}: {len(grp)} acks, mean total {statistics.mean(g[0] for g in grp) / 1e3:.0f} us")
        print(f"  {'actor':14s} {'wait us':>8s} {'run us':>8s}   (mean per ack, inside [send, delivery])")
        for k in names:
            ws, rs = by_actor_w.get(k, []), by_actor_r.get(k, [])
            w0, r0 = [x[0] for x in ws], [x[0] for x in rs]
            mw = statistics.mean(overlap(ws, w0, a, b) for _, a, b in grp) / 1e3
            mr = statistics.mean(overlap(rs, r0, a, b) for _, a, b in grp) / 1e3
            if mw >= 5 or mr >= 5:
                print(f"  {k:14s} {mw:8.0f} {mr:8.0f}")
    # who held the cores while a broker loop waited, in the slowest 1%
    held: collections.Counter[str] = collections.Counter()
    allruns = sorted((s, e, actor.get(t, "other")) for iv3 in runs.values() for s, e, t in iv3)
    rstarts = [x[0] for x in allruns]
    slow = groups["slowest 1%"]
    for k in [x for x in names if x.endswith(":loop")]:
        for s, e in by_actor_w[k]:
            if not any(a <= s < b for _, a, b in slow[:: max(1, len(slow) // 50)]):
                continue
            i = max(0, bisect.bisect_right(rstarts, s) - 50)
            while i < len(allruns) and allruns[i][0] < e:
                a, b, who = allruns[i]
                held[who] += max(0, min(b, e) - max(a, s))
                i += 1
    total = sum(held.values()) or 1
    print("\nwhile a broker loop waited (sampled slow acks): core time by actor")
    for who, ns in held.most_common(12):
        print(f"  {who:14s} {100 * ns / total:5.1f}%")
    # long waits per loop
    for k in [x for x in names if x.endswith(":loop")]:
        d = sorted((e - s) / 1e3 for s, e in by_actor_w[k])
        if d:
            print(
                f"{k}: {len(d)} waits, p50 {d[len(d) // 2]:.0f} p99 {d[int(len(d) * 0.99)]:.0f} max {d[-1]:.0f} us, over 1 ms {sum(x > 1000 for x in d)}"
            )


if __name__ == "__main__":
    main()
