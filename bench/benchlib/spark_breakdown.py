"""Where a Spark micro-batch's time goes: Spark's progress durations joined with the connector's
own timers (``exactly.spark.timings``), one row per micro-batch.

Driver phases come from the progress report (``durationMs``): ``latestOffset`` (the source plans
the batch), ``getBatch``, ``queryPlanning``, ``walCommit`` (offset log), ``addBatch`` (the job:
every task plus the sink's driver commit), ``commitOffsets`` (commit log) and
``triggerExecution`` (the whole trigger). Inside ``addBatch``, the connector's timers give task
seconds (summed over tasks; two cores run two at a time): the source read (``fetch``: librdkafka
consume, ``arrow``: records -> Arrow), the state operator's update and commit time (Spark's
``stateOperators``), the sink's write task (``sink.convert``: Arrow -> rows; ``sink.prepare``: the
task's own time - transaction set-up, produce, flush and prepare - without the time it waited for
its input rows, which is upstream work), the sink's driver commit (decision +
EndTxns; wall seconds, it runs alone), and the start of every new Python worker that ran one of
them (fork, imports, unpickling). ``other`` is what addBatch spends outside the timed work: task
scheduling, the shuffle, the JVM's side of the Arrow hand-overs, the Python UDF of the state
operator - estimated as addBatch minus the driver commit minus the timed task seconds spread over
the cores (so it is a lower bound on the untimed part).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

DRIVER_PHASES = ("latestOffset", "getBatch", "queryPlanning", "walCommit", "addBatch", "commitOffsets")
COLUMNS = (
    "batch",
    "rows",
    "trigger",
    *DRIVER_PHASES,
    "src.fetch",
    "src.arrow",
    "state",
    "sink.convert",
    "sink.prepare",
    "commit",
    "py.start",
    "other",
)


def _sum(lines: Iterable[dict[str, Any]], key: str) -> float:
    return sum(float(line.get(key) or 0.0) for line in lines)


def batch_rows(
    progress: list[dict[str, Any]], timings: list[dict[str, Any]], cores: int
) -> list[dict[str, float]]:
    """One row per micro-batch that read something; seconds throughout."""
    rows = []
    for p in progress:
        if not p.get("numInputRows"):
            continue
        query, batch = p.get("id"), p.get("batchId")
        mine = [t for t in timings if t.get("query") == query and t.get("batch") == batch]
        source = [t for t in mine if t["kind"] == "source"]
        sink = [t for t in mine if t["kind"] == "sink"]
        commit = [t for t in mine if t["kind"] == "commit"]
        durations = p.get("durationMs") or {}
        state_ms = sum(
            float(op.get(k) or 0)
            for op in p.get("stateOperators") or []
            for k in ("allUpdatesTimeMs", "allRemovalsTimeMs", "commitTimeMs")
        )
        row: dict[str, float] = {
            "batch": float(batch or 0),
            "rows": float(p["numInputRows"]),
            "trigger": float(durations.get("triggerExecution", 0)) / 1000.0,
        }
        for phase in DRIVER_PHASES:
            row[phase] = float(durations.get(phase, 0)) / 1000.0
        row["src.fetch"] = _sum(source, "connect") + _sum(source, "fetch")
        row["src.arrow"] = _sum(source, "arrow")
        row["state"] = state_ms / 1000.0
        row["sink.convert"] = _sum(sink, "convert")
        # the write task's own time: its whole run minus waiting for upstream rows and converting
        row["sink.prepare"] = max(0.0, _sum(sink, "task") - _sum(sink, "input") - row["sink.convert"])
        row["commit"] = _sum(commit, "total")
        row["py.start"] = _sum(mine, "worker_start_s")
        task_seconds = row["src.fetch"] + row["src.arrow"] + row["sink.convert"] + row["sink.prepare"]
        row["other"] = max(0.0, row["addBatch"] - row["commit"] - task_seconds / max(1, cores))
        rows.append(row)
    return rows


def per_row_us(rows: list[dict[str, float]]) -> dict[str, float]:
    """Microseconds per input row of every time column over the warm batches (all but the first):
    the column's seconds summed over those batches / their rows. At large batches this is the
    per-row cost; at small ones the per-trigger costs dominate it."""
    warm = rows[1:] or rows
    total_rows = sum(r["rows"] for r in warm)
    if not total_rows:
        return {}
    return {c: sum(r[c] for r in warm) / total_rows * 1e6 for c in COLUMNS[2:]}


def render_table(title: str, rows: list[dict[str, float]]) -> list[str]:
    """Markdown: one line per micro-batch, the median of the batches after the first, and the
    microseconds per row of the batches after the first."""
    if not rows:
        return []
    out = [
        f"**{title}** (seconds; src/sink/py columns are task seconds summed over tasks)",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "| " + " | ".join("---:" for _ in COLUMNS) + " |",
    ]
    for row in rows:
        out.append("| " + " | ".join(_cell(c, row[c]) for c in COLUMNS) + " |")
    warm = rows[1:] or rows
    median = {c: statistics.median(r[c] for r in warm) for c in COLUMNS}
    out.append("| " + " | ".join(["**median (warm)**", *(_cell(c, median[c]) for c in COLUMNS[1:])]) + " |")
    micros = per_row_us(rows)
    if micros:
        rows_warm = sum(r["rows"] for r in warm)
        cells = [f"{micros[c]:.1f}" for c in COLUMNS[2:]]
        out.append("| " + " | ".join(["**us/row (warm)**", f"{rows_warm:,.0f}", *cells]) + " |")
    out.append("")
    return out


def _cell(column: str, value: float) -> str:
    if column in ("batch", "rows"):
        return f"{value:,.0f}"
    return f"{value:.3f}"
