"""Log compaction (issue #11) in the report: cleaner throughput, produce latency with the cleaner busy
vs idle, internal topics' size and restart time with the cleaner on vs off.  Rendered from the
entries of kind ``compaction`` (bench/benchlib/compaction_workloads.py)."""

from __future__ import annotations

from typing import Any

from benchlib.cluster_report import _cell, _targets
from benchlib.fmt import runs_ok


def section(by_kind: dict[str, list[dict[str, Any]]]) -> list[str]:
    entries = {e["workload"]: e for e in by_kind.get("compaction", [])}
    if not entries:
        return []
    out = ["## Log compaction (issue #11)", ""]
    thr = [entries[n] for n in ("cleaner-throughput", "cleaner-throughput-100b") if n in entries]
    if thr:
        out += [
            "| cleaner pass | value bytes | MB/s | MB read | MB written | pass s | broker CPU s | load avg (1 min) "
            "| runs ok |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for e in thr:
            s = e["samples"]
            out.append(
                f"| {e['workload']} | {_cell(s, 'value_bytes', 0)} | {_cell(s, 'cleaner_mb_s', 2)} "
                f"| {_cell(s, 'mb_read', 1)} | {_cell(s, 'mb_written', 2)} | {_cell(s, 'pass_s', 2)} "
                f"| {_cell(s, 'broker_cpu_s', 1)} | {_cell(s, 'load1', 2)} | {runs_ok(e)} |"
            )
        out += [
            "",
            "One pass of the cleaner over a 1-partition compacted topic of records over 1,000 keys, written "
            "with the cleaner off and cleaned after a restart with it on (no other load). MB/s = bytes the pass "
            "read / its duration (`/metrics`).",
            "",
        ]
    for name in ("cleaner-produce-latency", "cleaner-produce-latency-priority"):
        out += _latency(entries.get(name))
    for name in ("compaction-internal", "compaction-internal-aged", "compaction-internal-month"):
        out += _internal(entries.get(name))
    return out


def _internal(e: dict[str, Any] | None) -> list[str]:
    out: list[str] = []
    if e:
        s = e["samples"]
        aged = e["workload"].endswith("-aged")
        month = e["workload"].endswith("-month")
        if aged:
            heading = ": `log.cleaner.delete.retention.ms=1000`"
        elif month:
            heading = ": a month compressed in time (delete.retention.ms = one simulated day)"
        else:
            heading = ": Kafka's defaults (delete.retention.ms 24 h)"
        out += [
            f"### `{e['workload']}`{heading}",
            "",
            "| internal topics | KB `__consumer_offsets` | KB `__transaction_state` | KB total | restart to ready s "
            "| of which to listening s |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for v, label in (("on", "cleaner on"), ("off", "cleaner off (log.cleaner.enable=false)")):
            out.append(
                f"| {label} | {_cell(s, f'{v}_offsets_kb', 0)} "
                f"| {_cell(s, f'{v}_txn_state_kb', 0)} "
                f"| {_cell(s, f'{v}_kb', 0)} | {_cell(s, f'{v}_restart_s', 2)} "
                f"| {_cell(s, f'{v}_listen_s', 2)} |"
            )
        out.append(
            f"| fresh broker (empty data dir) | — | — | — | {_cell(s, 'fresh_restart_s', 2)} "
            f"| {_cell(s, 'fresh_listen_s', 2)} |"
        )
        first = s[0] if s else {}
        if month:
            out += [
                "",
                f"The load interleaved (one OffsetCommit request per 10 transactions) and paced over "
                f"{first.get('month_s', 0):.0f} s standing for 30 days; `log.cleaner.delete.retention.ms` = "
                f"one simulated day. Load took {_cell(s, 'on_load_s', 0)} s; the retention covered "
                f"{_cell(s, 'retention_sim_h', 1)} simulated hours (24 = on its timeline).",
            ]
        out += [
            "",
            f"Load per broker: {first.get('commits', 0):,} offset commits (OffsetCommit requests of 100 partitions, "
            f"{first.get('groups', 0)} groups x 100 partitions = {first.get('groups', 0) * 100:,} keys) "
            f"{'and' if month else 'then'} "
            f"{first.get('transactions', 0):,} transactions (AddOffsetsToTxn + TxnOffsetCommit + EndTxn commit) over "
            f"{first.get('tids', 0):,} transactional ids, written through the wire to both brokers at once; both "
            f"internal topics with 1 partition and {first.get('segment', 0) // 1024} KB segments. Commits took "
            f"{_cell(s, 'on_commit_s', 1)} s and transactions {_cell(s, 'on_txn_s', 1)} s on the cleaner-on broker. "
            f"Size on / off {_cell(s, 'size_ratio', 4)}; restart on / fresh {_cell(s, 'restart_ratio', 2)}, "
            f"off / fresh {_cell(s, 'off_restart_ratio', 2)}; load avg (1 min) {_cell(s, 'load1', 2)} "
            f"(max {_cell(s, 'load1_max', 1)}); runs ok {runs_ok(e)}. Targets: {_targets(e)}.",
            "",
            "*Ready*: from the process start until OffsetFetch returns the last committed offset of the last group "
            "written (the group coordinator loaded `__consumer_offsets`) and InitProducerId of a new transactional "
            "id succeeds (the transaction coordinator loaded `__transaction_state`).",
            "",
        ]
    return out


def _num(value: Any, digits: int) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _latency(e: dict[str, Any] | None) -> list[str]:
    if not e:
        return []
    s = e["samples"]
    first = s[0] if s else {}
    phases = [k[: -len("_windows")] for k in first if k.endswith("_windows")]
    out = [
        f"### `{e['workload']}`",
        "",
        "| produce at 1,000 msg/s | windows | ack p50 ms | ack p99 ms (pooled) | ack p99 ms (mean of windows) "
        "| ack p99.9 ms | ack max ms | broker cores "
        "| of which worker | event loop waiting for a CPU ms/s | load avg (1 min) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for v in phases:
        label = {
            "idle": "cleaner idle (worker stopped)",
            "busy": "cleaner busy (worker as shipped)",
            "idle_after": "idle after the pass ended (diagnostic)",
        }.get(v, f"cleaner {v}")
        out.append(
            f"| {label} | {first.get(f'{v}_windows', 0)} | {_cell(s, f'{v}_ack_p50_ms', 2)} "
            f"| {_cell(s, f'{v}_pooled_ack_p99_ms', 2)} "
            f"| {_cell(s, f'{v}_ack_p99_ms', 2)} | {_cell(s, f'{v}_ack_p999_ms', 2)} "
            f"| {_cell(s, f'{v}_ack_max_ms', 1)} | {_cell(s, f'{v}_broker_cores', 2)} "
            f"| {_cell(s, f'{v}_worker_cores', 2)} | {_cell(s, f'{v}_loop_wait_ms_per_s', 1)} "
            f"| {_cell(s, f'{v}_load1', 2)} |"
        )
    ratios = [k for k in first if k.startswith("p99_ratio")]
    busy = sum(1 for x in s if x.get("cleaner_busy_whole_window"))
    out += [
        "",
        "Per repetition and window, in measuring order within each phase (ms; *stalls*: runs of acks >= 10 ms):",
        "",
    ]
    for i, x in enumerate(s):
        cells = []
        for v in phases:
            if not x.get(f"{v}_p99_per_window"):
                continue
            p99s = ", ".join(_num(a, 2) for a in x[f"{v}_p99_per_window"])
            maxes = ", ".join(_num(a, 1) for a in x.get(f"{v}_max_per_window", []))
            st = ", ".join(str(a) for a in x.get(f"{v}_stalls_per_window", []))
            cells.append(f"{v} p99 [{p99s}] max [{maxes}] stalls [{st}]")
        rounds = ", ".join(_num(a, 2) for a in x.get("round_p99_ratios", []))
        out.append(
            f"- rep {i + 1}: busy/idle pooled p99 {_num(x.get('p99_ratio'), 2)}, mean-of-windows "
            f"{_num(x.get('mean_window_p99_ratio'), 2)}, per round [{rounds}]; " + "; ".join(cells)
        )
    out += [
        "",
        "p99 ratios per repetition (each phase's acks pooled over its windows: p99 / idle's): "
        + "; ".join(
            f"{k.removeprefix('p99_ratio_') if k != 'p99_ratio' else 'busy'} {_cell(s, k, 2)}" for k in ratios
        )
        + f". The pass covered every busy window in {busy}/{len(s)} runs; runs ok {runs_ok(e)}. "
        f"Targets: {_targets(e)}.",
        "",
        "`latency-1k`'s loop (linger.ms=0, acks=all, idempotent, 1 KB) to a fresh topic per window, on one "
        "broker whose cleaner is in its first pass over a compacted backlog of 100 B records. The bench "
        "stops (SIGSTOP) the cleaner's worker process and resumes it (SIGCONT) only for the busy windows, "
        "which alternate with the idle ones in one sequence (ABBA order, reversed per repetition): same "
        "broker, same uptime, same box load. Stopped, the worker is as idle as a cleaner with nothing to "
        "do (the broker's cleaner thread waits on its pipe). Broker cores include the worker's. *Event loop "
        "waiting for a CPU*: the run-queue delay of the broker's main thread (`/proc/<pid>/task/<pid>/schedstat`) "
        "per second of window. A "
        "phase with a nice value had the worker reniced for its windows only.",
        "",
    ]
    return out
