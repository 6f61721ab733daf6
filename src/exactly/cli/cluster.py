"""`exactly cluster --brokers N --data-dir D`: a local replicated cluster for development.

Starts one standalone ZooKeeper (``D/zookeeper``) and N brokers (``D/broker-<id>``, broker ids
0..N-1, each ``exactly serve`` with ``zookeeper.connect`` on a chroot ``/exactly``) on 127.0.0.1,
prints ``bootstrap servers: h:p,h:p,...`` once every broker listens, and on SIGTERM/SIGINT stops
the brokers (SIGTERM, one after the other: each a controlled shutdown that hands its
leaderships to the brokers still running) and then ZooKeeper. A broker that exits on its own stops the
whole cluster with exit status 1, its output kept in ``D/broker-<id>.log``.

``exactly cluster verify-replicas --bootstrap-server H:P [--topic T ...]`` compares every replica
of every partition up to the high watermark (Kafka's ``kafka-replica-verification.sh``; see
``exactly.client.replica_verification``): one line per partition, a line per difference, exit
status 1 if any replica differs or cannot be read, 0 otherwise (lag alone is not an error).

``exactly cluster status --bootstrap-server H:P`` prints the live brokers and their endpoints, the
controller, every partition's leader / leader epoch / replicas / ISR with under-replicated and
offline partitions marked and counted, and the group and transaction coordinators (the leaders
of the ``__consumer_offsets`` / ``__transaction_state`` partitions), from one Metadata request
(``exactly.client.cluster_status``). ``--json`` for scripts, ``--problems`` for the bad rows only,
``--group G`` / ``--transactional-id T`` for one key's coordinator. Exit status 0, or 1 with
``--fail-on-under-replicated`` when a partition is under-replicated or offline, or with
``--fail-on-offline`` when one is offline; 1 also when no broker answers.

Brokers run through ``exactly.testing.broker`` (the project's one launcher). They are
subprocesses, not threads: each is a real broker process with its own event loop,
exactly what a deployment runs, and ``kill -9`` on one of them is a real broker failure.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path

from exactly.cli.overrides import parse_overrides
from exactly.cli.security_options import add_security_options, security_config
from exactly.client.security import ClientConfigError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("cluster", help="run ZooKeeper + N replicated brokers on loopback (development)")
    p.add_argument("--brokers", type=int, default=3, help="number of brokers (default 3)")
    p.add_argument("--data-dir", type=Path, help="directory for ZooKeeper and broker data (required)")
    p.add_argument(
        "--zookeeper-port", type=int, default=0, help="ZooKeeper client port (default: a free one)"
    )
    p.add_argument(
        "-o",
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="broker config by Kafka name, for every broker",
    )
    p.set_defaults(func=run)
    tools = p.add_subparsers(dest="cluster_command", metavar="TOOL")
    v = tools.add_parser(
        "verify-replicas",
        help="compare every replica's batches up to the high watermark (exit 1 on a difference)",
    )
    v.add_argument("--bootstrap-server", required=True, help="HOST:PORT[,HOST:PORT...] of the cluster")
    v.add_argument(
        "--topic", action="append", default=None, help="only this topic (repeatable; default: all)"
    )
    v.add_argument("--timeout", type=float, default=10.0, help="socket timeout in seconds (default 10)")
    add_security_options(v)
    v.set_defaults(func=verify_replicas)
    st = tools.add_parser(
        "status",
        help="brokers, controller, partitions (leader/ISR, under-replicated, offline), coordinators",
    )
    st.add_argument("--bootstrap-server", required=True, help="HOST:PORT[,HOST:PORT...] of the cluster")
    st.add_argument(
        "--topic", action="append", default=None, help="only this topic (repeatable; default: all)"
    )
    st.add_argument(
        "--problems", action="store_true", help="list only under-replicated and offline partitions"
    )
    st.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    st.add_argument("--group", action="append", default=[], help="show the coordinator of this group id")
    st.add_argument(
        "--transactional-id",
        action="append",
        default=[],
        help="show the coordinator of this transactional id",
    )
    st.add_argument(
        "--fail-on-under-replicated",
        action="store_true",
        help="exit 1 if any partition is under-replicated or offline",
    )
    st.add_argument("--fail-on-offline", action="store_true", help="exit 1 if any partition is offline")
    st.add_argument("--timeout", type=float, default=10.0, help="socket timeout in seconds (default 10)")
    add_security_options(st)
    st.set_defaults(func=status)


def status(args: argparse.Namespace) -> int:
    from exactly.client.cluster_status import coordinator_of, read_status, render
    from exactly.client.wire import WireError

    try:
        state = read_status(
            args.bootstrap_server, args.topic, timeout_s=args.timeout, config=security_config(args)
        )
    except (WireError, ClientConfigError) as exc:
        print(f"exactly cluster status: {exc}", file=sys.stderr)
        return 1
    keys = [("group", g) for g in args.group] + [("transaction", t) for t in args.transactional_id]
    found = {f"{kind}:{key}": coordinator_of(state, kind, key) for kind, key in keys}
    if args.json:
        doc = state.to_json()
        if keys:
            doc["coordinator_of"] = {
                name: None if where is None else {"partition": where[0], "broker": where[1]}
                for name, where in found.items()
            }
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(render(state, problems_only=args.problems, color=sys.stdout.isatty()))
        for name, where in found.items():
            kind, _, key = name.partition(":")
            if where is None:
                print(f"{kind} {key!r}: no coordinator topic yet")
            else:
                broker = f"broker {where[1]}" if where[1] >= 0 else "NONE (offline)"
                print(f"{kind} {key!r}: coordinator {broker} (partition {where[0]})")
    if args.fail_on_offline and state.offline:
        return 1
    if args.fail_on_under_replicated and (state.offline or state.under_replicated):
        return 1
    return 0


def verify_replicas(args: argparse.Namespace) -> int:
    from exactly.client.replica_verification import verify_replicas as verify
    from exactly.client.wire import WireError

    try:
        verdicts = verify(
            args.bootstrap_server, args.topic, timeout_s=args.timeout, config=security_config(args)
        )
    except (WireError, ClientConfigError) as exc:
        print(f"exactly cluster verify-replicas: {exc}", file=sys.stderr)
        return 1
    for verdict in verdicts:
        print(verdict.describe())
    bad = [v for v in verdicts if not v.consistent]
    print(f"{len(verdicts)} partitions verified, {len(bad)} with differences or unreadable replicas")
    return 1 if bad else 0


def run(args: argparse.Namespace) -> int:
    from exactly.cli.local_cluster import LocalCluster, internal_topic_defaults
    from exactly.cluster.zookeeper import ZooKeeperError
    from exactly.testing.broker import BrokerError

    if args.data_dir is None:
        print("exactly cluster: --data-dir is required", file=sys.stderr)
        return 2
    if args.brokers < 1:
        print("exactly cluster: --brokers must be at least 1", file=sys.stderr)
        return 2
    overrides = parse_overrides(args.override, "cluster")
    if overrides is None:
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _signo, _frame: stop.set())
    # -o wins over the internal topics' defaults (replication capped at the number of brokers)
    cluster = LocalCluster(
        args.data_dir,
        args.brokers,
        {**internal_topic_defaults(args.brokers), **overrides},
        args.zookeeper_port,
    )
    try:
        try:
            cluster.start()
        except (ZooKeeperError, BrokerError) as exc:
            print(f"exactly cluster: {exc}", file=sys.stderr)
            return 1
        print(f"zookeeper {cluster.connect}", flush=True)
        print(f"bootstrap servers: {cluster.bootstrap}", flush=True)
        while not stop.wait(0.5):
            for broker in cluster.brokers:
                if not broker.running:
                    print(
                        f"exactly cluster: {broker.name} exited ({broker.returncode}); see {broker.log_path}",
                        file=sys.stderr,
                    )
                    return 1
        return 0
    finally:
        cluster.close()
