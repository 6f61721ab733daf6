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
    e = entries.get("cleaner-produce-latency")
    if e:
        s = e["samples"]
        out += [
            "| produce at 1,000 msg/s | ack p50 ms | ack p99 ms | ack p99.9 ms | ack max ms | broker cores "
            "| load avg (1 min) |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for v in ("busy", "control", "idle"):
            if not any(x.get(f"{v}_ack_p99_ms") for x in s):
                continue
            label = "cleaner off (control)" if v == "control" else f"cleaner {v}"
            out.append(
                f"| {label} | {_cell(s, f'{v}_ack_p50_ms', 2)} | {_cell(s, f'{v}_ack_p99_ms', 2)} "
                f"| {_cell(s, f'{v}_ack_p999_ms', 2)} | {_cell(s, f'{v}_ack_max_ms', 1)} "
                f"| {_cell(s, f'{v}_broker_cores', 2)} | {_cell(s, f'{v}_load1', 2)} |"
            )
        busy = sum(1 for x in s if x.get("cleaner_busy_whole_window"))
        out += [
            "",
            f"busy / idle p99 per repetition {_cell(s, 'p99_ratio', 2)}; busy / control p99 per repetition "
            f"{_cell(s, 'p99_ratio_control', 2)}; the cleaner's pass covered the whole busy "
            f"window in {busy}/{len(s)} runs; runs ok {runs_ok(e)}. Targets: {_targets(e)}.",
            "",
            "`latency-1k`'s loop (linger.ms=0, acks=all, idempotent, 1 KB) to a fresh topic on a broker whose cleaner "
            "is in its first pass over a compacted backlog (**busy**), then on the same broker once the backlog is "
            "clean (**idle**: the cleaner thread still polls every 100 ms and finds nothing). **Control** (when "
            "present): a second broker on a copy of the same backlog, started at the same time with the cleaner "
            "off, measured right before or after *busy* (order alternating per repetition) while the pass runs: "
            "the same box load and a just-restarted broker, without cleaning.",
            "",
        ]
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
