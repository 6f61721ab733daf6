"""`exactly zookeeper`: a local standalone ZooKeeper on 127.0.0.1 for the cluster mode, until
SIGTERM/SIGINT (then the server is stopped and reaped; its data directory is kept)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("zookeeper", help="run a local standalone ZooKeeper (development)")
    p.add_argument("--data-dir", required=True, type=Path, help="directory for zoo.cfg, data and log")
    p.add_argument("--port", type=int, default=2181, help="client port on 127.0.0.1 (0 picks one)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from exactly.cluster.zookeeper import ZooKeeperError, ZooKeeperServer

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _signo, _frame: stop.set())
    args.data_dir.mkdir(parents=True, exist_ok=True)
    server = ZooKeeperServer(args.data_dir.resolve(), args.port)
    try:
        address = server.start()
    except ZooKeeperError as exc:
        print(f"exactly zookeeper: {exc}", file=sys.stderr)
        return 1
    try:
        print(f"zookeeper listening on {address.connect}", flush=True)
        while not stop.wait(0.5):
            process = server.process
            if process is None or process.poll() is not None:
                print(f"exactly zookeeper: the server exited; see {server.log_path}", file=sys.stderr)
                return 1
    finally:
        server.stop()
    return 0
