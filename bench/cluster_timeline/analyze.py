#!/usr/bin/env python3
"""Stage-by-stage timeline of acks=all produces from ``run.py``'s output directory.

    python bench/cluster_timeline/analyze.py OUT [--batched]

For each one-record batch at offset o (the first 200 skipped): the leader's produce frame in,
handler start, append (log end o+1); per follower f: the leader's first Fetch answer to f with
records after that append, f's receipt of the frame, its append past o, its next Fetch sent, the
leader's accounting of it; the HW reaching o+1, the delayed produce completed, the answer
resolved and written; the client's delivery report. Percentiles per stage in microseconds (p50,
p90, p99, and the mean of the slowest 1% by total), then each broker's collections.
"""

from __future__ import annotations

import bisect
import json
import statistics
import sys
from pathlib import Path

Event = tuple[int, str, int, int]


def load(d: Path) -> tuple[dict[int, tuple[int, int]], dict[int, list[Event]]]:
    client = json.loads((d / "client.json").read_text())
    acks = {int(k): (v[0], v[1]) for k, v in client["acks"].items()}
    events: dict[int, list[Event]] = {}
    for broker, pid in client["pids"].items():
        rows: list[Event] = []
        for line in (d / f"trace-{pid}.txt").read_text().splitlines():
            ns, name, a, b = line.split()
            rows.append((int(ns), name, int(a), int(b)))
        events[int(broker)] = rows
    return acks, events


def after(rows: list[Event], t: int, field: int = 0, at_least: int = 0) -> Event:
    """The first event at or after ``t`` (whose ``field`` is at least ``at_least``, if given)."""
    for r in rows[bisect.bisect_left(rows, (t,)) :]:
        if not field or r[field] >= at_least:
            return r
    raise LookupError(t)


def before(rows: list[Event], t: int) -> Event:
    return rows[bisect.bisect_left(rows, (t,)) - 1]


Stage = tuple[int, int]  # (start, end) on CLOCK_MONOTONIC, ns


def timeline(out: Path, batched: bool = False) -> tuple[list[dict[str, Stage]], dict[int, list[Event]]]:
    """Each acknowledged record's stages (name -> (start, end)), and the brokers' events.
    ``batched``: every record, by the batch it went in (a loaded box batches), else only
    one-record batches."""
    acks, ev = load(out)
    leader = ev[0]

    def named(rows: list[Event], name: str, a: int | None = None) -> list[Event]:
        return [r for r in rows if r[1] == name and (a is None or r[2] == a)]

    appended = {r[2]: r[0] for r in named(leader, "p_app")}
    completed = {r[2]: r[0] for r in named(leader, "ack_done")}
    frames_in, starts = named(leader, "frame_in", 0), named(leader, "p_start")
    resumes, writes, hws = named(leader, "p_resume"), named(leader, "write"), named(leader, "hw")
    # the follower fast path's answers carry no replica id (-1): then either follower's counts
    answers = {f: [r for r in leader if r[1] == "f_resp" and r[3] > 0 and r[2] in (f, -1)] for f in (1, 2)}
    accounted = {f: named(leader, "l_ffetch", f) for f in (1, 2)}
    got = {f: named(ev[f], "r_frame") for f in (1, 2)}
    follower_appends = {f: named(ev[f], "r_appended") for f in (1, 2)}
    sends = {f: named(ev[f], "r_send") for f in (1, 2)}
    rows: list[dict[str, Stage]] = []
    ends = sorted(appended)
    for o in sorted(acks)[200:]:
        sent, acked = acks[o]
        if batched:
            i = bisect.bisect_right(ends, o)
            if i == len(ends):
                continue
            end = ends[i]
        else:
            end = o + 1
        a = appended.get(end)
        if a is None:
            continue  # not a one-record batch
        o = end - 1  # the batch's last record: what the followers and the HW must pass
        try:
            s = before(starts, a)[0]
            fi = before(frames_in, s)[0]
            row = {"client->frame_in": (sent, fi), "frame_in->p_start": (fi, s), "p_start->app": (s, a)}
            last = 0
            for f in (1, 2):
                r = after(answers[f], a)[0]
                fr = after(got[f], a)[0]
                r = min(r, fr)
                ap = after(follower_appends[f], fr, 2, o + 1)[0]
                sd = after(sends[f], ap)[0]
                lf = after(accounted[f], sd, 3, o + 1)[0]
                row |= {
                    f"f{f}:app->leader_resp": (a, r),
                    f"f{f}:resp->follower_frame": (r, fr),
                    f"f{f}:frame->appended": (fr, ap),
                    f"f{f}:appended->send": (ap, sd),
                    f"f{f}:send->leader_ffetch": (sd, lf),
                }
                last = max(last, lf)
            h = after(hws, a, 2, o + 1)[0]
            done = completed.get(o + 1, h)
            pr = after(resumes, done)[0]
            w = after(writes, pr)[0]
        except LookupError:
            continue
        row |= {
            "last_ffetch->hw": (last, h),
            "hw->ack_done": (h, done),
            "ack_done->p_resume": (done, pr),
            "p_resume->write": (pr, w),
            "write->client_ack": (w, acked),
            "TOTAL": (sent, acked),
        }
        rows.append(row)
    return rows, ev


def main() -> None:
    batched = "--batched" in sys.argv
    spans, ev = timeline(Path(sys.argv[1]), batched)
    rows = [{k: b - a for k, (a, b) in r.items()} for r in spans]
    rows.sort(key=lambda r: r["TOTAL"])
    n = len(rows)
    slow = rows[int(n * 0.99) :]
    print(f"{n} {'records' if batched else 'one-record produces'}; microseconds")
    print(f"{'stage':26s} {'p50':>7s} {'p90':>7s} {'p99':>7s} | slowest 1% mean")
    for k in rows[0]:
        v = sorted(r[k] / 1e3 for r in rows)
        mean = statistics.mean(r[k] for r in slow) / 1e3
        print(f"{k:26s} {v[n // 2]:7.0f} {v[int(n * 0.9)]:7.0f} {v[int(n * 0.99)]:7.0f} | {mean:7.0f}")
    for broker, events in ev.items():
        pauses: list[tuple[float, int]] = []
        start: Event | None = None
        for e in events:
            if e[1] == "gc_start":
                start = e
            elif e[1] == "gc_stop" and start is not None:
                pauses.append(((e[0] - start[0]) / 1e3, start[2]))
                start = None
        by_gen = {g: sum(1 for _, gen in pauses if gen == g) for g in (0, 1, 2)}
        longest = max((p for p, _ in pauses), default=0.0)
        print(f"broker {broker}: collections by generation {by_gen}, longest {longest:.0f} us")


if __name__ == "__main__":
    main()
