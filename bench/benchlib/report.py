"""Markdown + JSON rendering of a benchmark run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchlib import cluster_report, cluster_txn_report, compaction_report
from benchlib.fmt import num as _f
from benchlib.fmt import runs_ok as _runs
from benchlib.fmt import spread as _spread
from benchlib.workloads import REGISTRY, median_of


def render(meta: dict[str, Any], entries: list[dict[str, Any]]) -> str:
    out: list[str] = [f"# Benchmark: {meta['name']}", ""]
    out.append(f"- when: {meta['started']} (took {meta.get('elapsed_s', 0):.0f} s); git {meta['git']}")
    out.append(f"- machine: {meta['machine']}")
    out.append(f"- clients: {meta['clients']}")
    out.append(
        f"- mode: {'quick' if meta['quick'] else 'full'}; {meta['records']:,} records x "
        f"{meta['record_size']} B per throughput run; median of {meta['repeat']} run(s) "
        "(min-max in brackets); MB = 10^6 bytes of record values, GB = 10^9"
    )
    if meta.get("chart"):
        out.append(f"- chart: [{meta['chart']}]({meta['chart']})")
    if meta.get("broker_options"):
        out.append(f"- broker options: {' '.join(meta['broker_options'])}")
    for b in meta.get("brokers", []):
        out.append(f"- broker {b['name']}: {b['detail']}")
    out.append("")

    by_kind: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        by_kind.setdefault(e["kind"], []).append(e)

    out += scorecard(entries)

    thr = by_kind.get("throughput", [])
    if thr:
        out += [
            "## Throughput",
            "",
            "| workload | broker | MB/s | records/s | broker CPU-s/GB | broker cores | client CPU-s/GB "
            "| client cores | runs ok |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for e in thr:
            s = e["samples"]
            out.append(
                f"| {e['workload']} | {e['broker']} | {_f(median_of(s, 'mb_s'))}{_spread(s, 'mb_s')} "
                f"| {_f(median_of(s, 'records_s'), 0)} | {_f(median_of(s, 'broker_cpu_s_per_gb'), 2)} "
                f"| {_f(median_of(s, 'broker_cores'), 2)} | {_f(median_of(s, 'client_cpu_s_per_gb'), 2)} "
                f"| {_f(median_of(s, 'client_cores'), 2)} | {_runs(e)} |"
            )
        out += [
            "",
            "*cores* = CPU-seconds / wall-seconds: ~1.0 for the broker means one core is saturated "
            "(for a single-threaded Python broker, that is the ceiling); ~1.0 for the client means the "
            "figure is client-bound. The machine has 2 cores shared by broker and client.",
            "",
        ]

        peers = sorted({e["broker"] for e in thr} - {"exactly"})
        for peer in peers:
            out += [
                f"## exactly vs {peer}",
                "",
                f"| workload | exactly MB/s | {peer} MB/s | ratio | exactly CPU-s/GB | {peer} CPU-s/GB "
                "| ratio |",
                "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
            ]
            for e in thr:
                if e["broker"] != "exactly":
                    continue
                p = next((x for x in thr if x["broker"] == peer and x["workload"] == e["workload"]), None)
                if p is None:
                    continue
                a, b = median_of(e["samples"], "mb_s"), median_of(p["samples"], "mb_s")
                c, d = (
                    median_of(e["samples"], "broker_cpu_s_per_gb"),
                    median_of(p["samples"], "broker_cpu_s_per_gb"),
                )
                r1 = f"{a / b:.2f}x" if a and b else "—"
                r2 = f"{c / d:.2f}x" if c and d else "—"
                out.append(f"| {e['workload']} | {_f(a)} | {_f(b)} | {r1} | {_f(c, 2)} | {_f(d, 2)} | {r2} |")
            out += [
                "",
                "ratio = exactly / peer: above 1 is better for MB/s, below 1 is better for CPU-s/GB.",
                "",
            ]

    out += pair_section(by_kind.get("pair", []))
    out += cluster_report.section(by_kind)
    out += cluster_txn_report.section(by_kind)
    out += compaction_report.section(by_kind)
    out += group_section(by_kind.get("group", []))

    lat = by_kind.get("latency", [])
    if lat:
        out += [
            "## Latency",
            "",
            "| workload | broker | rate/s | ack p50 | ack p99 | ack p99.9 | ack max | e2e p50 | e2e p99 "
            "| e2e p99.9 | e2e max | broker cores | runs ok |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for e in lat:
            s = e["samples"]
            cells = [
                _f(median_of(s, k), 2)
                for k in (
                    "ack_p50_ms",
                    "ack_p99_ms",
                    "ack_p999_ms",
                    "ack_max_ms",
                    "e2e_p50_ms",
                    "e2e_p99_ms",
                    "e2e_p999_ms",
                    "e2e_max_ms",
                )
            ]
            out.append(
                f"| {e['workload']} | {e['broker']} | {_f(median_of(s, 'achieved_rate'), 0)} | "
                + " | ".join(cells)
                + f" | {_f(median_of(s, 'broker_cores'), 2)} | {_runs(e)} |"
            )
        out += [
            "",
            "Milliseconds. ack = produce() to delivery report (acks=all, linger.ms=0); e2e = produce() "
            "to the record reaching a consumer (confluent-kafka, assign(), default fetch.wait.max.ms=500: a "
            "broker that does not answer a parked Fetch as soon as data arrives shows up here).",
            "",
        ]

    rec = by_kind.get("recovery", [])
    if rec:
        out += [
            "## Recovery after kill -9",
            "",
            "| workload | broker | data GB | records | fill MB/s | to listening s | to offsets ok s "
            "| broker CPU-s | RSS MB | runs ok |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for e in rec:
            s = e["samples"]
            out.append(
                f"| {e['workload']} | {e['broker']} | {_f(median_of(s, 'data_gb'), 2)} | "
                f"{_f(median_of(s, 'records'), 0)} | {_f(median_of(s, 'fill_mb_s'))} | "
                f"{_f(median_of(s, 'listen_s'), 2)}{_spread(s, 'listen_s', 2)} | "
                f"{_f(median_of(s, 'ready_s'), 2)}{_spread(s, 'ready_s', 2)} | "
                f"{_f(median_of(s, 'broker_cpu_s'), 2)} | {_f(median_of(s, 'rss_mb'), 0)} | {_runs(e)} |"
            )
        out += [
            "",
            "Warm page cache (no drop_caches). *to offsets ok*: spawn until ListOffsets returns every "
            "partition's pre-kill end offset. *fill MB/s* is the kcat load that built the data set.",
            "",
        ]

    phys = by_kind.get("physical", [])
    if phys:
        out += [
            "## Physical limits (same harness, same machine)",
            "",
            "| probe | what | MB/s | CPU-s | runs ok |",
            "| --- | --- | ---: | ---: | --- |",
        ]
        for e in phys:
            s = e["samples"]
            out.append(
                f"| {e['workload']} | {e['title']} | {_f(median_of(s, 'mb_s'))}{_spread(s, 'mb_s')} | "
                f"{_f(median_of(s, 'client_cpu_s'), 2)} | {_runs(e)} |"
            )
        out.append("")

    out += targets_section(entries)

    failures = [(e, s) for e in entries for s in e["samples"] if not s.get("ok")]
    setup_failures = [e for e in entries if e.get("setup_error")]
    if failures or setup_failures:
        out += [
            "## Failures and capability gaps",
            "",
            "Left out of the medians. *fails X* = the broker ran the workload but failed its verification.",
            "",
        ]
        for e in setup_failures:
            out.append(f"- {e['workload']} on {e['broker']}: setup: {e['setup_error']}")
        for e, s in failures:
            out.append(f"- {e['workload']} on {e['broker']} run {s.get('rep', '?')}: {s.get('error')}")
        out.append("")

    if meta.get("notes"):
        out += ["## Notes", ""] + [f"- {n}" for n in meta["notes"]] + [""]
    return "\n".join(out)


# kinds benchlib/chart.py draws (the cluster's kinds have tables only): no empty chart for a cluster-only run
CHARTED_KINDS = frozenset({"throughput", "pair", "latency", "group", "recovery", "physical"})


def write(
    out_dir: Path, meta: dict[str, Any], entries: list[dict[str, Any]], chart_png: bool = True
) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = out_dir / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    md = out_dir / f"{meta['name']}.md"
    png = out_dir / f"{meta['name']}.png"
    if chart_png and any(e["kind"] in CHARTED_KINDS for e in entries):
        try:
            from benchlib import chart

            chart.render(meta, entries, png)
            meta["chart"] = png.name
        except ImportError as exc:
            meta["chart"] = None
            meta.setdefault("notes", []).append(f"no chart: {exc} (pip install -e '.[dev]')")
    md.write_text(render(meta, entries))
    js = raw / f"{meta['name']}-{meta['stamp']}.json"
    js.write_text(json.dumps({"meta": meta, "entries": entries}, indent=1, default=str))
    return md, js


# ------------------------------------------------------------------------------ issue #5 / pairs / groups


def _entry(entries: list[dict[str, Any]], workload: str, broker: str) -> dict[str, Any] | None:
    return next((e for e in entries if e["workload"] == workload and e["broker"] == broker), None)


def _unsupported(entry: dict[str, Any] | None) -> str:
    """A capability the broker lacks, as detected by the workload (e.g. read_committed not filtering)."""
    if entry is None:
        return ""
    texts = [s.get("unsupported") for s in entry["samples"] if s.get("unsupported")]
    return texts[0].split(":")[0] if texts and len(texts) == len(entry["samples"]) else ""


def _value(entry: dict[str, Any] | None, metric: str, digits: int = 2) -> str:
    if entry is None:
        return "not run"
    if entry.get("setup_error"):
        return "setup failed"
    why = _unsupported(entry)
    if why:
        return f"**{why}**"
    v = median_of(entry["samples"], metric)
    if v is None:
        return "failed"
    return _f(v, digits) + _spread(entry["samples"], metric, digits)


PEER_RATIO_TARGET = 1.5  # issue #5: exactly's produce MB/s >= 1.5x Tansu's, same run


def scorecard(entries: list[dict[str, Any]]) -> list[str]:
    """Issue #5 targets (and issue #3's ratios) per workload: exactly, the peer's figure, met?"""
    rows: list[str] = []
    peers = sorted({e["broker"] for e in entries} - {"exactly", "-"})
    peer = peers[0] if peers else None
    for e in entries:
        if e["broker"] != "exactly":
            continue
        cls = REGISTRY.get(e["workload"])
        for t in cls.targets if cls else ():
            if t.issue not in ("#5", "#3"):
                continue
            m = None if _unsupported(e) else median_of(e["samples"], t.metric)
            met = t.met(m)
            pv = "—"
            if peer is not None:
                pe = _entry(entries, e["workload"], peer)
                pv = _value(pe, t.metric) if pe is not None else "n/a"
                if e["workload"].startswith("recovery-"):
                    pv = "n/a (in-memory)"
                elif e["workload"] == "group-assign-delay3000":
                    pv = "see delay0 row"
            rows.append(
                f"| {t.issue} | {e['workload']} | {t.text()} | {_value(e, t.metric)} | {pv} | "
                f"{'—' if met is None else ('yes' if met else '**NO**')} |"
            )
        if e["workload"] == "group-assign-delay3000":
            rows.append(
                f"| info | {e['workload']} | (Kafka default delay, reported separately) | "
                f"{_value(e, 'assign_s')} | — | — |"
            )
        if peer is not None and e["kind"] == "throughput" and e["workload"].startswith("produce-"):
            pe = _entry(entries, e["workload"], peer)
            a = median_of(e["samples"], "mb_s")
            b = median_of(pe["samples"], "mb_s") if pe else None
            if a and b:
                ratio = a / b
                rows.append(
                    f"| #5 | {e['workload']} | ≥ {PEER_RATIO_TARGET:g}x {peer} MB/s | {ratio:.2f}x "
                    f"({_f(a)} / {_f(b)} MB/s) | — | {'yes' if ratio >= PEER_RATIO_TARGET else '**NO**'} |"
                )
    if not rows:
        return []
    head = [
        "## Issue #5 scorecard (and issue #3's ratios)",
        "",
        f"| issue | workload | target | exactly | {peer or 'peer'} | exactly met? |",
        "| --- | --- | --- | ---: | ---: | --- |",
    ]
    return [
        *head,
        *rows,
        "",
        "Medians with min-max in brackets. Ratios (txn-*, rc-*) are medians of per-repetition pairs run "
        "back to back on the same broker. A bold capability note in the peer column means the peer ran the "
        "workload but failed its verification (e.g. read_committed delivered aborted records).",
        "",
    ]


def pair_section(pairs: list[dict[str, Any]]) -> list[str]:
    if not pairs:
        return []
    out = [
        "## Paired workloads (A and B back to back in each repetition)",
        "",
        "| workload | broker | A | A MB/s | A records/s | A broker CPU-s/GB | B | B MB/s | B records/s "
        "| B broker CPU-s/GB | A/B ratio (MB/s) | A/B CPU-s/GB | runs ok |",
        "| --- | --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    notes: list[str] = []
    for e in pairs:
        cls = REGISTRY.get(e["workload"])
        a, b = (cls.a, cls.b) if cls else ("a", "b")
        s = e["samples"]
        why = _unsupported(e)
        ratio = f"**{why}**" if why else f"{_f(median_of(s, 'ratio'), 3)}{_spread(s, 'ratio', 3)}"
        if why:  # show what was measured anyway
            s = [dict(x, ok=True) for x in s]
        out.append(
            f"| {e['workload']} | {e['broker']} | {a} | {_f(median_of(s, f'{a}_mb_s'))} | "
            f"{_f(median_of(s, f'{a}_records_s'), 0)} | {_f(median_of(s, f'{a}_broker_cpu_s_per_gb'), 2)} | "
            f"{b} | {_f(median_of(s, f'{b}_mb_s'))} | {_f(median_of(s, f'{b}_records_s'), 0)} | "
            f"{_f(median_of(s, f'{b}_broker_cpu_s_per_gb'), 2)} | {ratio} | "
            f"{_f(median_of(s, 'cpu_ratio'), 2)} | {_runs(e)} |"
        )
        if cls is not None and cls.ratio_of:
            note = f"`{e['workload'].rsplit('-', 1)[0]}-*`: A/B = {cls.ratio_of}"
            if note not in notes:
                notes.append(note)
        commits = median_of(s, "txn_commits")
        if commits:
            per = 1000 / commits
            notes.append(
                f"{e['workload']} on {e['broker']}: {commits:.0f} commits per run, "
                f"{_f(median_of(s, 'txn_txn_ms'), 0)} ms per transaction; per commit "
                f"{_f((median_of(s, 'txn_commit_s') or 0) * per, 1)} ms blocked = "
                f"{_f((median_of(s, 'txn_flush_s') or 0) * per, 1)} ms draining in-flight records (flush) + "
                f"{_f((median_of(s, 'txn_endtxn_s') or 0) * per, 1)} ms EndTxn; worst commit "
                f"{_f(median_of(s, 'txn_commit_max_ms'), 0)} ms (medians over runs)"
            )
        aborted = median_of(s, "aborted_records")
        if aborted:
            notes.append(
                f"{e['workload']} on {e['broker']}: log of {_f(median_of(s, 'log_records'), 0)} records in "
                f"{_f(median_of(s, 'transactions'), 0)} transactions, {aborted:,.0f} aborted; rc delivered "
                f"{_f(median_of(s, 'rc_records'), 0)} records ({_f(median_of(s, 'rc_aborted_delivered'), 0)} "
                f"aborted), ru {_f(median_of(s, 'ru_records'), 0)}"
            )
    out += [
        "",
        "Each repetition runs both variants back to back (order alternating) and the ratio is taken per "
        "pair; the table shows medians (min-max of the ratio in brackets). MB/s of 10^6 record-value bytes.",
        "",
        *[f"- {n}" for n in notes],
        "",
    ]
    return out


def group_section(groups: list[dict[str, Any]]) -> list[str]:
    if not groups:
        return []
    out = [
        "## Consumer group: subscribe -> first assignment",
        "",
        "| workload | broker | group.initial.rebalance.delay.ms | first join on the broker (cold) s "
        "| fresh group s (median) | runs ok |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    for e in groups:
        cls = REGISTRY.get(e["workload"])
        delay = str(cls.delay_ms) if (cls and e["broker"] == "exactly") else "(its own)"
        s = e["samples"]
        out.append(
            f"| {e['workload']} | {e['broker']} | {delay} | {_f(median_of(s, 'cold_s'), 2)} | "
            f"{_f(median_of(s, 'assign_s'), 3)}{_spread(s, 'assign_s', 3)} | {_runs(e)} |"
        )
    out += [
        "",
        "confluent-kafka consumer (classic protocol), 4-partition topic, connection and metadata set up "
        "before the clock; time from subscribe() to the on_assign callback. exactly runs on a private broker "
        "started with the delay shown; *cold* is the first join on that broker (exactly creates "
        "__consumer_offsets then).",
        "",
    ]
    return out


def targets_section(entries: list[dict[str, Any]]) -> list[str]:
    rows = []
    for e in entries:
        cls = REGISTRY.get(e["workload"])
        for t in cls.targets if cls else ():
            m = None if _unsupported(e) else median_of(e["samples"], t.metric)
            met = t.met(m)
            rows.append(
                f"| {t.issue} | {e['workload']} | {e['broker']} | {t.text()} | {_value(e, t.metric)} | "
                f"{'—' if met is None else ('yes' if met else '**NO**')} |"
            )
    if not rows:
        return []
    return [
        "## All targets",
        "",
        "| issue | workload | broker | target | measured | met? |",
        "| --- | --- | --- | --- | ---: | --- |",
        *rows,
        "",
    ]
