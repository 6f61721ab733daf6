"""PNG chart of a benchmark run (matplotlib, Agg backend): one panel per kind of figure, exactly next to
the peer, the issue targets as dashed lines.  Written next to the markdown report as ``<name>.png``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from benchlib.workloads import median_of

COLORS = {"exactly": "#1f77b4", "tansu": "#ff7f0e"}
OTHER = "#7f7f7f"


def _color(broker: str) -> str:
    return COLORS.get(broker, OTHER)


def _brokers(entries: list[dict[str, Any]]) -> list[str]:
    names = sorted({e["broker"] for e in entries} - {"-"}, key=lambda b: (b != "exactly", b))
    return names


def _unsupported(entry: dict[str, Any]) -> str:
    texts = [s.get("unsupported") for s in entry["samples"] if s.get("unsupported")]
    return texts[0].split(":")[0] if texts and len(texts) == len(entry["samples"]) else ""


def _grouped_bars(
    ax: Any,
    entries: list[dict[str, Any]],
    metric: str,
    title: str,
    ylabel: str,
    targets: list[tuple[float, str]] = (),  # type: ignore[assignment]
    log: bool = False,
) -> None:
    workloads = list(dict.fromkeys(e["workload"] for e in entries))
    brokers = _brokers(entries)
    width = 0.8 / max(1, len(brokers))
    for j, b in enumerate(brokers):
        xs, ys, labels = [], [], []
        for i, w in enumerate(workloads):
            e = next((x for x in entries if x["workload"] == w and x["broker"] == b), None)
            if e is None:
                continue
            why = _unsupported(e)
            v = None if why else median_of(e["samples"], metric)
            x = i + (j - (len(brokers) - 1) / 2) * width
            if v is None:
                ax.text(
                    x,
                    0.02,
                    why or "failed",
                    rotation=90,
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    color=_color(b),
                    transform=ax.get_xaxis_transform(),
                )
                continue
            xs.append(x)
            ys.append(v)
            labels.append(v)
        bars = ax.bar(xs, ys, width=width * 0.95, color=_color(b), label=b)
        for rect, v in zip(bars, labels):
            ax.annotate(
                f"{v:.3g}",
                (rect.get_x() + rect.get_width() / 2, rect.get_height()),
                ha="center",
                va="bottom",
                fontsize=6,
            )
    for value, label in targets:
        ax.axhline(value, color="red", linestyle="--", linewidth=0.8)
        ax.annotate(
            label,
            (1.0, value),
            xycoords=("axes fraction", "data"),
            ha="right",
            va="bottom",
            fontsize=7,
            color="red",
        )
    ax.set_xticks(range(len(workloads)))
    ax.set_xticklabels(workloads, rotation=35, ha="right", fontsize=7)
    ax.set_title(title, fontsize=9)
    ax.set_ylabel(ylabel, fontsize=8)
    if log:
        ax.set_yscale("log")
    ax.tick_params(axis="y", labelsize=7)
    if brokers:
        ax.legend(fontsize=7)


def render(meta: dict[str, Any], entries: list[dict[str, Any]], path: Path) -> Path:
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        by_kind.setdefault(e["kind"], []).append(e)
    fig, axes = plt.subplots(2, 3, figsize=(18, 10))
    ax = axes.flat

    thr = by_kind.get("throughput", [])
    _grouped_bars(ax[0], thr, "mb_s", "Throughput (median)", "MB/s of record values")
    _grouped_bars(
        ax[1],
        thr,
        "broker_cpu_s_per_gb",
        "Broker CPU per GB",
        "broker CPU-s / GB",
        [(1.0, "issue #5 produce ≤ 1.0"), (1.5, "issue #2 ≤ 1.5")],
    )

    pairs = by_kind.get("pair", [])
    _grouped_bars(
        ax[2],
        pairs,
        "ratio",
        "Paired ratios: txn/idempotent MB/s, read_committed/read_uncommitted MB/s scanned",
        "ratio (median of pairs)",
        [(0.98, "issue #5 ≥ 0.98"), (0.97, "issue #3 ≥ 0.97")],
    )
    if pairs:
        vals = [v for v in (median_of(e["samples"], "ratio") for e in pairs) if v is not None]
        ax[2].set_ylim(max(0.0, min([*vals, 0.9]) - 0.1), max([*vals, 1.05]) + 0.1)

    lat = by_kind.get("latency", [])
    keys = ["ack_p50_ms", "ack_p99_ms", "ack_p999_ms", "e2e_p50_ms", "e2e_p99_ms", "e2e_p999_ms"]
    brokers = _brokers(lat)
    width = 0.8 / max(1, len(brokers))
    for j, b in enumerate(brokers):
        e = next((x for x in lat if x["broker"] == b), None)
        if e is None:
            continue
        vals = [median_of(e["samples"], k) or 0.0 for k in keys]
        xs = [i + (j - (len(brokers) - 1) / 2) * width for i in range(len(keys))]
        bars = ax[3].bar(xs, vals, width=width * 0.95, color=_color(b), label=b)
        for rect, v in zip(bars, vals):
            ax[3].annotate(
                f"{v:.3g}",
                (rect.get_x() + rect.get_width() / 2, rect.get_height()),
                ha="center",
                va="bottom",
                fontsize=6,
            )
    ax[3].axhline(3.0, color="red", linestyle="--", linewidth=0.8)
    ax[3].annotate(
        "issue #5 ack p99 ≤ 3 ms",
        (1.0, 3.0),
        xycoords=("axes fraction", "data"),
        ha="right",
        va="bottom",
        fontsize=7,
        color="red",
    )
    ax[3].set_xticks(range(len(keys)))
    ax[3].set_xticklabels([k.replace("_ms", "").replace("p999", "p99.9") for k in keys], fontsize=7)
    ax[3].set_yscale("log")
    ax[3].set_ylabel("ms (log)", fontsize=8)
    ax[3].set_title(f"Latency at {meta.get('latency_rate', 1000)} msg/s, 1 KB, acks=all", fontsize=9)
    if brokers:
        ax[3].legend(fontsize=7)

    _grouped_bars(
        ax[4],
        by_kind.get("group", []),
        "assign_s",
        "Consumer group: subscribe -> first assignment",
        "seconds (log)",
        [(0.5, "issue #5 ≤ 0.5 s")],
        log=True,
    )

    rec = by_kind.get("recovery", [])
    labels, vals = [], []
    for e in rec:
        for k, lab in (("listen_s", "to listening"), ("ready_s", "to offsets ok")):
            v = median_of(e["samples"], k)
            if v is not None:
                labels.append(f"{e['broker']}\n{lab}")
                vals.append(v)
    bars = ax[5].bar(range(len(vals)), vals, color=COLORS["exactly"])
    for rect, v in zip(bars, vals):
        ax[5].annotate(
            f"{v:.2f}",
            (rect.get_x() + rect.get_width() / 2, rect.get_height()),
            ha="center",
            va="bottom",
            fontsize=7,
        )
    ax[5].axhline(2.0, color="red", linestyle="--", linewidth=0.8)
    ax[5].annotate(
        "issue #5 ≤ 2 s",
        (1.0, 2.0),
        xycoords=("axes fraction", "data"),
        ha="right",
        va="bottom",
        fontsize=7,
        color="red",
    )
    ax[5].set_xticks(range(len(vals)))
    ax[5].set_xticklabels(labels, fontsize=7)
    ax[5].set_ylabel("seconds", fontsize=8)
    gb = median_of(rec[0]["samples"], "data_gb") if rec else None
    ax[5].set_title(f"Restart after kill -9 ({gb or 0:.2f} GB, 100 partitions; exactly only)", fontsize=9)
    phys = [
        f"{e['workload']}: {median_of(e['samples'], 'mb_s') or 0:,.0f} MB/s"
        for e in by_kind.get("physical", [])
    ]
    if phys:
        ax[5].text(
            0.02,
            0.98,
            "physical limits:\n" + "\n".join(phys),
            transform=ax[5].transAxes,
            va="top",
            fontsize=7,
            family="monospace",
        )

    fig.suptitle(
        f"exactly benchmark {meta.get('name')} — {meta.get('started')} — git {meta.get('git')} — "
        f"{'quick' if meta.get('quick') else 'full'}, median of {meta.get('repeat')} (pairs: more)",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
