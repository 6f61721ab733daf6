"""Number formatting shared by the report sections (report.py, cluster_report.py)."""

from __future__ import annotations

from typing import Any

from benchlib.workloads import spread_of


def num(v: float | None, digits: int = 1) -> str:
    if v is None:
        return "—"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}f}"


def spread(samples: list[dict[str, Any]], key: str, digits: int = 0) -> str:
    sp = spread_of(samples, key)
    if sp is None or len([s for s in samples if s.get("ok")]) < 2:
        return ""
    return f" ({num(sp[0], digits)}-{num(sp[1], digits)})"


def runs_ok(entry: dict[str, Any]) -> str:
    samples = entry["samples"]
    ok = sum(1 for s in samples if s.get("ok"))
    text = f"{ok}/{len(samples)}"
    if entry.get("setup_error"):
        text = "setup failed"
    return text if ok == len(samples) and samples else f"**{text}**"
