"""Markdown + JSON rendering of a benchmark run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchlib.workloads import REGISTRY, median_of, spread_of


def _f(v: float | None, digits: int = 1) -> str:
    if v is None:
        return "—"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}f}"


def _spread(samples: list[dict[str, Any]], key: str, digits: int = 0) -> str:
    sp = spread_of(samples, key)
    if sp is None or len([s for s in samples if s.get("ok")]) < 2:
        return ""
    return f" ({_f(sp[0], digits)}-{_f(sp[1], digits)})"


def _runs(entry: dict[str, Any]) -> str:
    samples = entry["samples"]
    ok = sum(1 for s in samples if s.get("ok"))
    text = f"{ok}/{len(samples)}"
    if entry.get("setup_error"):
        text = "setup failed"
    return text if ok == len(samples) and samples else f"**{text}**"


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
    if meta.get("broker_options"):
        out.append(f"- broker options: {' '.join(meta['broker_options'])}")
    for b in meta.get("brokers", []):
        out.append(f"- broker {b['name']}: {b['detail']}")
    out.append("")

    by_kind: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        by_kind.setdefault(e["kind"], []).append(e)

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

        out += [
            "## Targets (issue #2)",
            "",
            "| workload | broker | target | measured | met? |",
            "| --- | --- | --- | ---: | --- |",
        ]
        for e in thr:
            cls = REGISTRY.get(e["workload"])
            for t in cls.targets if cls else ():
                m = median_of(e["samples"], t.metric)
                met = t.met(m)
                out.append(
                    f"| {e['workload']} | {e['broker']} | {t.text()} | {_f(m, 2)} | "
                    f"{'—' if met is None else ('yes' if met else '**NO**')} |"
                )
        out.append("")

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

    failures = [(e, s) for e in entries for s in e["samples"] if not s.get("ok")]
    setup_failures = [e for e in entries if e.get("setup_error")]
    if failures or setup_failures:
        out += ["## Failures", ""]
        for e in setup_failures:
            out.append(f"- {e['workload']} on {e['broker']}: setup: {e['setup_error']}")
        for e, s in failures:
            out.append(f"- {e['workload']} on {e['broker']} run {s.get('rep', '?')}: {s.get('error')}")
        out.append("")

    if meta.get("notes"):
        out += ["## Notes", ""] + [f"- {n}" for n in meta["notes"]] + [""]
    return "\n".join(out)


def write(out_dir: Path, meta: dict[str, Any], entries: list[dict[str, Any]]) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = out_dir / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    md = out_dir / f"{meta['name']}.md"
    md.write_text(render(meta, entries))
    js = raw / f"{meta['name']}-{meta['stamp']}.json"
    js.write_text(json.dumps({"meta": meta, "entries": entries}, indent=1, default=str))
    return md, js
