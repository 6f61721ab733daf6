#!/usr/bin/env python3
"""Per-ack phase times of a ``run.py`` trace, for the slow acks specifically.

    python bench/cluster_timeline/phases.py OUT [--sched]

For every record the client sent in a one-record Produce (offset o; the first 200 skipped):

    sent (client) -> p_start (leader's produce path) -> p_app (appended, log end o+1)
    per follower f: -> answer with o prepared on the leader (a parked Fetch fired by the append,
    or a Fetch that arrived with the data already there) -> frame received by f -> appended by f
    -> f's next Fetch written -> the leader accounts it (fetch offset > o)
    -> hw (the HW reaches o+1, on the later of the two) -> ack_done (the delayed produce
    completed) -> write (its answer written) -> the client's delivery report.

Prints each phase's p50/p90/p99 (µs) over all records and its mean over the median (p45-p55) and
the slowest 1% of records by total, and how the data reached each follower (its Fetch parked when
the append came, or in flight: then it waits for that Fetch to arrive). ``--sched`` (a trace run
with ``SCHED_TRACE=1``) adds, per phase of the slow acks, how long the thread that moves the phase
on spent runnable but not running (waiting for a core), and how often it was woken on an idle CPU.
"""

from __future__ import annotations

import bisect
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

Event = tuple[int, str, int, int]


def load(d: Path) -> tuple[dict[int, tuple[int, int]], dict[int, list[Event]], dict[str, int]]:
    client = json.loads((d / "client.json").read_text())
    acks = {int(k): (v[0], v[1]) for k, v in client["acks"].items()}
    events: dict[int, list[Event]] = {}
    for broker, pid in client["pids"].items():
        rows: list[Event] = []
        for line in (d / f"trace-{pid}.txt").read_text().splitlines():
            ns, name, a, b = line.split()
            rows.append((int(ns), name, int(a), int(b)))
        rows.sort()
        events[int(broker)] = rows
    return acks, events, {k: int(v) for k, v in client["pids"].items()}


class Index:
    """Events of one broker by name, for 'first at or after t with field >= x' look-ups."""

    def __init__(self, rows: list[Event]) -> None:
        self.by: dict[str, list[Event]] = defaultdict(list)
        for r in rows:
            self.by[r[1]].append(r)

    def after(self, name: str, t: int, pred=None) -> Event:  # type: ignore[no-untyped-def]
        rows = self.by[name]
        for r in rows[bisect.bisect_left(rows, (t,)) :]:
            if pred is None or pred(r):
                return r
        raise LookupError(name)

    def before(self, name: str, t: int) -> Event:
        rows = self.by[name]
        i = bisect.bisect_right(rows, (t, "\uffff")) - 1
        if i < 0:
            raise LookupError(name)
        return rows[i]


def phases(out: Path) -> tuple[list[dict[str, tuple[int, int]]], list[dict[str, str]]]:
    acks, ev, _pids = load(out)
    L = Index(ev[0])
    F = {f: Index(ev[f]) for f in (1, 2)}
    appended = {r[2]: r[0] for r in L.by["p_app"]}
    rows: list[dict[str, tuple[int, int]]] = []
    modes: list[dict[str, str]] = []
    for o in sorted(acks)[200:]:
        sent, acked = acks[o]
        a = appended.get(o + 1)
        if a is None or (o in appended and appended[o] >= sent):
            continue  # not a one-record batch (another record's append ends at o)
        try:
            s = L.before("p_start", a)[0]
            row = {"sent->p_start": (sent, s), "p_start->p_app": (s, a)}
            mode: dict[str, str] = {}
            last = 0
            for f in (1, 2):
                fired = L.after("f_resp", a, lambda r, f=f: r[2] == f and r[3] > 0)[0]
                try:
                    arrived = L.after("f_arr_resp", a, lambda r, f=f: r[2] == f and r[3] > 0)[0]
                except LookupError:
                    arrived = 1 << 62
                resp = min(fired, arrived)
                mode[f"f{f}"] = "parked" if resp == fired else "in-flight"
                fr = F[f].after("r_frame", resp)[0]
                ap = F[f].after("r_appended", fr, lambda r, o=o: r[2] >= o + 1)[0]
                sd = F[f].after("r_send", ap)[0]
                lf = L.after("l_ffetch", sd, lambda r, f=f, o=o: r[2] == f and r[3] >= o + 1)[0]
                row |= {
                    f"f{f} app->answer": (a, resp),
                    f"f{f} answer->frame": (resp, fr),
                    f"f{f} frame->appended": (fr, ap),
                    f"f{f} appended->send": (ap, sd),
                    f"f{f} send->accounted": (sd, lf),
                }
                last = max(last, lf)
            h = L.after("hw", a, lambda r, o=o: r[2] >= o + 1)[0]
            done = L.after("ack_done", a, lambda r, o=o: r[2] >= o + 1)[0]
            w = L.after("write", done)[0]
        except LookupError:
            continue
        row |= {
            "2nd accounted->hw": (last, h),
            "hw->ack_done": (h, done),
            "ack_done->write": (done, w),
            "write->client": (w, acked),
            "TOTAL": (sent, acked),
        }
        rows.append(row)
        modes.append(mode)
    return rows, modes


# ----------------------------------------------------------------------------- scheduler view

_LINE = re.compile(r"^\s*(.+?)-(\d+)\s+\(\s*(\d+|-+)\)\s+\[(\d+)\].{5,6}\s+([\d.]+):\s+(\w+):\s+(.*)$")


def sched_waits(
    out: Path, tids: set[int]
) -> tuple[list[tuple[int, int, int, bool]], list[tuple[int, int, int]]]:
    """Runnable-not-running intervals (start ns, end ns, tid, woken on an idle cpu) of ``tids``,
    and every cpu's running intervals (start ns, end ns, tid; 0 = idle)."""
    waits: list[tuple[int, int, int, bool]] = []
    pending: dict[int, tuple[int, bool]] = {}
    idle: dict[int, bool] = {}
    running: list[tuple[int, int, int]] = []
    since: dict[int, tuple[int, int]] = {}  # cpu -> (start, tid)
    for line in (out / "sched.txt").read_text().splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        cpu, ts, kind, rest = int(m[4]), int(float(m[5]) * 1e9), m[6], m[7]
        if kind == "sched_wakeup":
            pm = re.search(r"pid=(\d+).*target_cpu=(\d+)", rest)
            if pm is None:
                continue
            tid, target = int(pm[1]), int(pm[2])
            if tid in tids and tid not in pending:
                pending[tid] = (ts, idle.get(target, False))
        elif kind == "sched_switch":
            pm = re.search(
                r"prev_pid=(\d+) prev_prio=\d+ prev_state=(\S+) ==> next_comm=.* next_pid=(\d+)", rest
            )
            if pm is None:
                continue
            prev, state, nxt = int(pm[1]), pm[2], int(pm[3])
            if prev in tids and state in ("R", "R+"):  # preempted: waits from now
                pending[prev] = (ts, False)
            if nxt in pending:
                t0, on_idle = pending.pop(nxt)
                waits.append((t0, ts, nxt, on_idle))
            idle[cpu] = nxt == 0
            if cpu in since:
                running.append((since[cpu][0], ts, prev))
            since[cpu] = (ts, nxt)
    waits.sort()
    running.sort()
    return waits, running


def main() -> None:
    out = Path(sys.argv[1])
    rows, modes = phases(out)
    if not rows:
        raise SystemExit("no one-record produces traced")
    spans = rows
    dur = [{k: b - a for k, (a, b) in r.items()} for r in spans]
    order = sorted(range(len(dur)), key=lambda i: dur[i]["TOTAL"])
    n = len(order)
    slow = order[int(n * 0.99) :]
    mid = order[int(n * 0.45) : int(n * 0.55)]
    print(f"{n} one-record produces; µs")
    print(f"{'phase':24s} {'p50':>6s} {'p90':>6s} {'p99':>6s} | {'median recs':>11s} | {'slowest 1%':>10s}")
    for k in dur[0]:
        v = sorted(d[k] / 1e3 for d in dur)
        print(
            f"{k:24s} {v[n // 2]:6.0f} {v[int(n * 0.9)]:6.0f} {v[int(n * 0.99)]:6.0f} | "
            f"{statistics.mean(dur[i][k] for i in mid) / 1e3:11.0f} | "
            f"{statistics.mean(dur[i][k] for i in slow) / 1e3:10.0f}"
        )
    for f in ("f1", "f2"):
        allp = sum(1 for m in modes if m[f] == "parked") / n
        slowp = sum(1 for i in slow if modes[i][f] == "parked") / max(1, len(slow))
        print(f"{f}: Fetch parked when the append came: {allp:.0%} of all, {slowp:.0%} of the slowest 1%")
    if "--sched" in sys.argv and (out / "sched.txt").exists():
        threads = json.loads((out / "threads.json").read_text())
        owner: dict[int, str] = {}
        for who, rows_ in threads.items():
            for tid, comm in rows_.items():
                if tid != "pid":
                    owner[int(tid)] = f"{who}:{comm}"
        waits, running = sched_waits(out, set(owner))
        starts = [w[0] for w in waits]
        # who moves each phase on: the process whose event ends it
        mover = {"sent->p_start": "0", "p_start->p_app": "0", "2nd accounted->hw": "0", "hw->ack_done": "0",
                 "ack_done->write": "0", "write->client": "client"}  # fmt: skip
        for f in ("1", "2"):
            mover |= {f"f{f} app->answer": "0", f"f{f} answer->frame": f, f"f{f} frame->appended": f,
                      f"f{f} appended->send": f, f"f{f} send->accounted": "0"}  # fmt: skip
        print(
            "\nwaiting for a core inside each phase (mover's threads), mean µs: median recs | slowest 1%;"
            " share of those waits that began with the target cpu idle (a halted vCPU woken)"
        )
        for k in dur[0]:
            if k == "TOTAL":
                continue
            who = mover[k]
            res = []
            for group in (mid, slow):
                tot, on_idle, cnt = 0, 0, 0
                for i in group:
                    a, b = spans[i][k]
                    j = bisect.bisect_left(starts, a - 50_000_000)
                    for w0, w1, tid, idle_ in waits[j:]:
                        if w0 > b:
                            break
                        if not owner.get(tid, "").startswith(who + ":"):
                            continue
                        ov = min(b, w1) - max(a, w0)
                        if ov > 0:
                            tot += ov
                            cnt += 1
                            on_idle += idle_
                res.append((tot / len(group) / 1e3, on_idle / max(1, cnt)))
            print(f"{k:24s} {res[0][0]:7.0f} ({res[0][1]:.0%}) | {res[1][0]:7.0f} ({res[1][1]:.0%})")

        def group(tid: int) -> str:
            name = owner.get(tid)
            if tid == 0:
                return "idle"
            if name is None:
                return "other"
            who, comm = name.split(":", 1)
            if who == "client":
                return "client:rdk" if comm.startswith("rdk:") else "client:py"
            return f"b{who}" if who.isdigit() else who

        # who held the cpus while a mover of a slow ack waited for one
        rstarts = [r[0] for r in running]
        held: dict[str, int] = defaultdict(int)
        for i in slow:
            for k, who in mover.items():
                a, b = spans[i][k]
                j = bisect.bisect_left(starts, a - 50_000_000)
                for w0, w1, tid, _idle in waits[j:]:
                    if w0 > b:
                        break
                    if not owner.get(tid, "").startswith(who + ":"):
                        continue
                    lo, hi = max(a, w0), min(b, w1)
                    if hi <= lo:
                        continue
                    r = bisect.bisect_left(rstarts, lo - 50_000_000)
                    for r0, r1, rt in running[r:]:
                        if r0 > hi:
                            break
                        ov = min(hi, r1) - max(lo, r0)
                        if ov > 0:
                            held[group(rt)] += ov
        total = sum(held.values()) or 1
        print(
            "cpus held while a slow ack's mover waited: "
            + ", ".join(f"{g} {v / total:.0%}" for g, v in sorted(held.items(), key=lambda x: -x[1]))
        )


if __name__ == "__main__":
    main()
