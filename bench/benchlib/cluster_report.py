"""The replicated cluster's section of the report (issue #9): throughput/CPU of RF 3 vs RF 1 vs the single
broker, latency at 1,000 msg/s, failover times.  Rendered from the entries of kinds ``cluster-pair``,
``cluster-latency`` and ``failover`` (bench/benchlib/cluster_workloads.py)."""

from __future__ import annotations

from typing import Any

from benchlib.fmt import num, runs_ok, spread
from benchlib.workloads import REGISTRY, median_of


def _cell(samples: list[dict[str, Any]], key: str, digits: int = 1) -> str:
    return num(median_of(samples, key), digits) + spread(samples, key, digits)


def _targets(entry: dict[str, Any]) -> str:
    cls = REGISTRY.get(entry["workload"])
    out = []
    for t in cls.targets if cls else ():
        m = median_of(entry["samples"], t.metric)
        met = t.met(m)
        out.append(f"{t.text()}: {num(m, 2)} {'—' if met is None else ('met' if met else '**NOT met**')}")
    return "; ".join(out)


def section(by_kind: dict[str, list[dict[str, Any]]]) -> list[str]:
    thr, lat, fo = (
        by_kind.get("cluster-pair", []),
        by_kind.get("cluster-latency", []),
        by_kind.get("failover", []),
    )
    if not (thr or lat or fo):
        return []
    out = ["## Replicated cluster (issue #9): 3 brokers + ZooKeeper on this box", ""]
    if thr:
        out += [
            "### Throughput and CPU: RF 3 acks=all vs RF 1 (same cluster) vs single broker",
            "",
            "| workload | variant | MB/s | broker CPU-s/GB (sum) | leader CPU-s/GB | followers CPU-s/GB "
            "| ZooKeeper CPU-s/GB | client cores | client CPU-s/GB | runs ok |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for e in thr:
            s = e["samples"]
            cls = REGISTRY.get(e["workload"])
            for v in getattr(cls, "variants", ("rf3", "rf1", "single")):
                out.append(
                    f"| {e['workload']} | {v} | {_cell(s, f'{v}_mb_s')} | {_cell(s, f'{v}_broker_cpu_s_per_gb', 2)} "
                    f"| {_cell(s, f'{v}_leader_cpu_s_per_gb', 2)} | {_cell(s, f'{v}_followers_cpu_s_per_gb', 2)} "
                    f"| {_cell(s, f'{v}_zk_cpu_s_per_gb', 3)} | {_cell(s, f'{v}_client_cores', 2)} "
                    f"| {_cell(s, f'{v}_client_cpu_s_per_gb', 2)} | {runs_ok(e)} |"
                )
            out += [
                "",
                f"{e['workload']}: RF 3 / RF 1 MB/s per repetition {_cell(s, 'ratio', 2)}; "
                + (
                    f"with the wire producer {_cell(s, 'ratio_wire', 2)} (its RF 3 / confluent's RF 3 MB/s "
                    f"{_cell(s, 'rf3_wire_vs_rf3', 2)}); "
                    if any("ratio_wire" in x for x in s)
                    else ""
                )
                + f"RF 3 / single "
                f"{_cell(s, 'ratio_single', 2)}; RF 1 (cluster) / single {_cell(s, 'rf1_vs_single', 2)}; "
                f"load avg (1 min) during the runs {_cell(s, 'load1', 2)}. Targets: {_targets(e)}.",
                "",
            ]
        out += [
            "RF 1 = a replication-factor-1 topic on the same 3-broker cluster; single = the embedded default "
            "broker (no ZooKeeper) running beside it; *_wire = the same topics written by the blocking "
            "idempotent wire producer (benchlib/batch_producer.py) instead of confluent-kafka. Broker 0 leads every measured partition (explicit "
            "assignment). CPU-s/GB: user+system CPU per 10^9 record bytes; *sum* over the three broker "
            "processes; ZooKeeper (a JVM) separately.",
            "",
        ]
    if lat:
        out += [
            "### Produce-to-ack latency at 1,000 msg/s (acks=all, linger.ms=0)",
            "",
            "| workload | topic | ack p50 ms | ack p99 ms | ack p99.9 ms | ack max ms | e2e p99 ms "
            "| broker cores (sum) | runs ok |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for e in lat:
            s = e["samples"]
            for v in ("rf3", "rf1"):
                out.append(
                    f"| {e['workload']} | {v} | {_cell(s, f'{v}_ack_p50_ms', 2)} | {_cell(s, f'{v}_ack_p99_ms', 2)} "
                    f"| {_cell(s, f'{v}_ack_p999_ms', 2)} | {_cell(s, f'{v}_ack_max_ms', 1)} "
                    f"| {_cell(s, f'{v}_e2e_p99_ms', 2)} | {_cell(s, f'{v}_broker_cores', 2)} | {runs_ok(e)} |"
                )
            out += ["", f"{e['workload']}: targets: {_targets(e)}; load avg {_cell(s, 'load1', 2)}.", ""]
    if fo:
        out += [
            "### Failover of a partition leader (RF 3, min.insync.replicas=2, idempotent producer at 500/s)",
            "",
            "| workload | session timeout s | to first ack of a new record s | broker znode gone s "
            "| new leader in ZooKeeper s | new leader in Metadata s | raw Produce acked s | longest ack gap s | victim exited s | victim was controller "
            "| rejoin (full ISR) s | runs ok |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- |",
        ]
        for e in fo:
            s = e["samples"]
            ctrl = [bool(x.get("victim_was_controller")) for x in s if x.get("ok")]
            timeout = median_of(s, "session_timeout_ms")
            out.append(
                f"| {e['workload']} | {num((timeout or 0) / 1000, 0)} | {_cell(s, 'failover_s', 2)} "
                f"| {_cell(s, 'gone_s', 2)} | {_cell(s, 'elected_s', 2)} | {_cell(s, 'metadata_s', 2)} | {_cell(s, 'wire_ack_s', 2)} "
                f"| {_cell(s, 'max_gap_s', 2)} "
                f"| {_cell(s, 'exit_s', 2)} | {sum(ctrl)}/{len(ctrl)} | {_cell(s, 'rejoin_s', 1)} | {runs_ok(e)} |"
            )
        out += [""] + [f"- {e['workload']}: {_targets(e)}" for e in fo]
        out += [
            "",
            "Seconds from the signal (t0). *first ack of a new record*: delivery report of the first record "
            "produced after t0 (only a new leader can acknowledge it). *znode gone*: the victim's "
            "/brokers/ids entry disappeared; *new leader in ZooKeeper*: the partition state znode names another "
            "broker; *in Metadata*: a surviving broker's Metadata answer does (polled every 10 ms); *raw Produce*: "
            "a one-record acks=all Produce sent every 10 ms to each surviving broker first succeeded (the cluster's "
            "own readiness, no client back-off). "
            "Every run verifies no record lost or duplicated (log count = records produced, all acknowledged).",
            "",
        ]
    return out
