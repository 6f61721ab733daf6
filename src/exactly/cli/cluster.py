"""`exactly cluster --brokers N --data-dir D`: a local replicated cluster for development.

Starts one standalone ZooKeeper (``D/zookeeper``) and N brokers (``D/broker-<id>``, broker ids
0..N-1, each ``exactly serve`` with ``zookeeper.connect`` on a chroot ``/exactly``) on 127.0.0.1,
prints ``bootstrap servers: h:p,h:p,...`` once every broker listens, and on SIGTERM/SIGINT stops
the brokers (SIGTERM, in parallel) and then ZooKeeper. A broker that exits on its own stops the
whole cluster with exit status 1, its output kept in ``D/broker-<id>.log``.

Brokers are subprocesses, not threads: each is a real broker process with its own event loop,
exactly what a deployment runs, and ``kill -9`` on one of them is a real broker failure.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

LISTEN_PREFIX = "exactly listening on "
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("cluster", help="run ZooKeeper + N replicated brokers on loopback (development)")
    p.add_argument("--brokers", type=int, default=3, help="number of brokers (default 3)")
    p.add_argument("--data-dir", required=True, type=Path, help="directory for ZooKeeper and broker data")
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


def run(args: argparse.Namespace) -> int:
    from exactly.cluster.zookeeper import ZooKeeperError, ZooKeeperServer

    if args.brokers < 1:
        print("exactly cluster: --brokers must be at least 1", file=sys.stderr)
        return 2
    for item in args.override:
        if "=" not in item:
            print(f"exactly cluster: -o expects KEY=VALUE, got {item!r}", file=sys.stderr)
            return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _signo, _frame: stop.set())
    data_dir: Path = args.data_dir.resolve()
    (data_dir / "zookeeper").mkdir(parents=True, exist_ok=True)
    zookeeper = ZooKeeperServer(data_dir / "zookeeper", args.zookeeper_port)
    try:
        address = zookeeper.start()
    except ZooKeeperError as exc:
        print(f"exactly cluster: {exc}", file=sys.stderr)
        return 1
    brokers: list[subprocess.Popen[bytes]] = []
    try:
        connect = f"{address.connect}/exactly"
        endpoints = []
        for broker_id in range(args.brokers):
            proc, endpoint = _start_broker(data_dir, broker_id, connect, args.override)
            brokers.append(proc)
            if endpoint is None:
                print(
                    f"exactly cluster: broker {broker_id} did not start; see {_log_path(data_dir, broker_id)}",
                    file=sys.stderr,
                )
                return 1
            endpoints.append(endpoint)
        print(f"zookeeper {connect}", flush=True)
        print(f"bootstrap servers: {','.join(endpoints)}", flush=True)
        while not stop.wait(0.5):
            for broker_id, proc in enumerate(brokers):
                if proc.poll() is not None:
                    print(
                        f"exactly cluster: broker {broker_id} exited ({proc.returncode}); see "
                        f"{_log_path(data_dir, broker_id)}",
                        file=sys.stderr,
                    )
                    return 1
        return 0
    finally:
        _stop_brokers(brokers)
        zookeeper.stop()


def _log_path(data_dir: Path, broker_id: int) -> Path:
    return data_dir / f"broker-{broker_id}.log"


def _start_broker(
    data_dir: Path, broker_id: int, connect: str, overrides: list[str]
) -> tuple[subprocess.Popen[bytes], str | None]:
    """Start one broker; wait for its ``exactly listening on`` line (in its log file)."""
    log_path = _log_path(data_dir, broker_id)
    cmd = [
        sys.executable,
        "-m",
        "exactly",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        str(data_dir / f"broker-{broker_id}"),
        "-o",
        f"broker.id={broker_id}",
        "-o",
        f"zookeeper.connect={connect}",
    ]
    for item in overrides:
        cmd += ["-o", item]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log_path.open("ab") as out:
        start = out.tell()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        with log_path.open("rb") as f:
            f.seek(start)
            for line in f.read().decode("utf-8", "replace").splitlines():
                if line.startswith(LISTEN_PREFIX):
                    return proc, line[len(LISTEN_PREFIX) :].strip()
        time.sleep(0.05)
    return proc, None


def _stop_brokers(brokers: list[subprocess.Popen[bytes]]) -> None:
    for proc in brokers:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for proc in brokers:
        try:
            proc.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
