"""Transactions on the cluster (issue #10) in the report: transactional / idempotent throughput, commit
latency RF 3 vs RF 1, coordinator failover.  Rendered from the entries of kinds ``cluster-txn-pair``,
``cluster-txn-latency`` (bench/benchlib/cluster_txn_workloads.py) and ``coordinator-failover``
(bench/benchlib/coordinator_failover.py)."""

from __future__ import annotations

from typing import Any

from benchlib.cluster_report import _cell, _targets
from benchlib.fmt import num, runs_ok
from benchlib.workloads import median_of


def section(by_kind: dict[str, list[dict[str, Any]]]) -> list[str]:
    pair, lat, fo = (
        by_kind.get("cluster-txn-pair", []),
        by_kind.get("cluster-txn-latency", []),
        by_kind.get("coordinator-failover", []),
    )
    if not (pair or lat or fo):
        return []
    out = ["## Transactions on the cluster (issue #10): 3 brokers + ZooKeeper on this box", ""]
    if pair:
        out += [
            "### Transactional (commit every 100 ms) / idempotent throughput, RF 3 acks=all",
            "",
            "| workload | variant | MB/s | broker CPU-s/GB (sum) | client cores | commits | ms per commit "
            "(flush + EndTxn) | EndTxn ms per commit | worst commit ms | runs ok |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for e in pair:
            s = e["samples"]
            commits = median_of(s, "txn_commits") or 0
            per = 1000 / commits if commits else 0.0
            for v in ("txn", "idem"):
                txn = v == "txn"
                out.append(
                    f"| {e['workload']} | {v} | {_cell(s, f'{v}_mb_s')} | {_cell(s, f'{v}_broker_cpu_s_per_gb', 2)} "
                    f"| {_cell(s, f'{v}_client_cores', 2)} | {num(commits, 0) if txn else '—'} "
                    f"| {num((median_of(s, 'txn_commit_s') or 0) * per, 1) if txn else '—'} "
                    f"| {num((median_of(s, 'txn_endtxn_s') or 0) * per, 1) if txn else '—'} "
                    f"| {_cell(s, 'txn_commit_max_ms', 0) if txn else '—'} | {runs_ok(e)} |"
                )
            lead = [bool(x.get("coordinator_is_leader")) for x in s if x.get("ok")]
            out += [
                "",
                f"{e['workload']}: txn / idempotent MB/s per repetition {_cell(s, 'ratio', 3)}; CPU-s/GB "
                f"txn / idempotent {_cell(s, 'cpu_ratio', 2)}; coordinator on the data leader in "
                f"{sum(lead)}/{len(lead)} runs; load avg (1 min) {_cell(s, 'load1', 2)}. Targets: {_targets(e)}.",
                "",
            ]
        out += [
            "Both variants to a fresh RF 3 topic (min.insync.replicas=2) led by broker 0, back to back in each "
            "repetition (order alternating); the transaction log is RF 3 (min.isr 2). Verified: ListOffsets up to "
            "the last stable offset = records + one COMMIT marker per transaction, and LSO = high watermark.",
            "",
        ]
    if lat:
        out += [
            "### Transaction commit latency, RF 3 vs RF 1 (100 x 1 KB per transaction, one every 100 ms)",
            "",
            "| workload | variant | EndTxn p50 ms | EndTxn p99 ms | EndTxn max ms | flush p50 ms | flush p99 ms "
            "| flush + EndTxn p50 ms | flush + EndTxn p99 ms | commits | broker cores (sum) | runs ok |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for e in lat:
            s = e["samples"]
            for v in ("rf3", "rf1"):
                out.append(
                    f"| {e['workload']} | {v} | {_cell(s, f'{v}_commit_p50_ms', 2)} | {_cell(s, f'{v}_commit_p99_ms', 2)} "
                    f"| {_cell(s, f'{v}_commit_max_ms', 1)} | {_cell(s, f'{v}_flush_p50_ms', 2)} "
                    f"| {_cell(s, f'{v}_flush_p99_ms', 2)} | {_cell(s, f'{v}_both_p50_ms', 2)} "
                    f"| {_cell(s, f'{v}_both_p99_ms', 2)} | {_cell(s, f'{v}_commits', 0)} "
                    f"| {_cell(s, f'{v}_broker_cores', 2)} | {runs_ok(e)} |"
                )
            lead = [bool(x.get("rf3_coordinator_is_leader")) for x in s if x.get("ok")]
            out += [
                "",
                f"{e['workload']}: RF 3 coordinator on the data leader in {sum(lead)}/{len(lead)} runs; "
                f"load avg {_cell(s, 'load1', 2)}.",
                "",
                "*EndTxn*: `commit_transaction()` after `flush()` returned (every record acked), i.e. the "
                "coordinator's PrepareCommit, markers and CompleteCommit as the broker orders them before it "
                "answers; *flush*: the transaction's 100 records acked (acks=all). **rf3**: the default cluster "
                "(transaction log RF 3, min.isr 2) and an RF 3 data topic (min.insync.replicas=2); **rf1**: a "
                "second 3-broker cluster beside it with `transaction.state.log.replication.factor=1` and an RF 1 "
                "data topic. Verified: the read_committed read-back holds every committed record exactly once; "
                "LSO = high watermark.",
                "",
            ]
    if fo:
        out += [
            "### Transaction coordinator failover (kill -9 of the coordinator's broker)",
            "",
            "| workload | session timeout s | to next successful commit s | broker znode gone s "
            "| new leader of __transaction_state in ZooKeeper s | new coordinator in FindCoordinator s "
            "| transactions aborted | commit retries | victim was controller | rejoin (full ISR) s | load avg (1 min) "
            "| runs ok |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | --- |",
        ]
        for e in fo:
            s = e["samples"]
            ctrl = [bool(x.get("victim_was_controller")) for x in s if x.get("ok")]
            timeout = median_of(s, "session_timeout_ms")
            out.append(
                f"| {e['workload']} | {num((timeout or 0) / 1000, 0)} | {_cell(s, 'failover_s', 2)} "
                f"| {_cell(s, 'gone_s', 2)} | {_cell(s, 'elected_s', 2)} | {_cell(s, 'coordinator_s', 2)} "
                f"| {_cell(s, 'aborted', 0)} | {_cell(s, 'retries', 0)} | {sum(ctrl)}/{len(ctrl)} "
                f"| {_cell(s, 'rejoin_s', 1)} | {_cell(s, 'load1', 1)} | {runs_ok(e)} |"
            )
        out += [""] + [f"- {e['workload']}: {_targets(e)}" for e in fo]
        out += [
            "",
            "Seconds from the kill -9 (t0) of the broker leading `__transaction_state`-0 (one partition: the "
            "coordinator of every transactional id), sent by a timer 1 s after a producer started committing "
            "transactions of 10 x 1 KB back to back to an RF 3 topic led by another broker. *Next successful "
            "commit*: the first `commit_transaction()` call begun after the victim was reaped that succeeded "
            "(calls time out after 1 s and are retried; an abortable error aborts the transaction and the "
            "loop goes on). *znode gone*: the victim's /brokers/ids entry disappeared (session expiry); "
            "*FindCoordinator*: a surviving broker first names another coordinator (polled every 10 ms). Every "
            "run verifies by a read_committed read-back that every committed transaction is there exactly once "
            "and no aborted one is, and that no transaction is left open.",
            "",
        ]
    return out
