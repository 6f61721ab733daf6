"""``exactly console``: serve the live web console (:mod:`exactly.webconsole`) of a cluster.

Binds to 127.0.0.1 unless ``--host`` says otherwise: the page can abort transactions and has no
login, so it is only reachable from the machine it runs on unless asked. The bootstrap server
may be ``exactly`` or any Kafka-compatible cluster; only standard admin APIs are used.

Prints one line, ``exactly console: serving http://HOST:PORT/ for BOOTSTRAP``, once the
server listens (``--port 0`` picks a free port, and that line tells which).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from typing import Any

import uvicorn

from exactly.cli.common import (
    add_connection_options,
    check_bootstrap,
    guarded,
    non_negative_int,
    positive_int,
    strict,
)
from exactly.cli.security_options import security_config
from exactly.webconsole.app import create_app
from exactly.webconsole.gather import Gatherer
from exactly.webconsole.model import DEFAULT_HANGING_AFTER_MS

DEFAULT_PORT = 8090


@guarded("exactly console")
def cmd_console(args: argparse.Namespace) -> int:
    check_bootstrap(args.bootstrap_server)
    gatherer = Gatherer(
        args.bootstrap_server,
        timeout_s=args.request_timeout,
        hanging_after_ms=args.hanging_after_ms,
        config=security_config(args),
    )
    app = create_app(gatherer, refresh_ms=args.refresh_ms)
    # bind first, so that --port 0 can be reported and a taken port fails before anything else
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
        sock.listen(128)  # listening before the line is printed: a client may connect at once
    except OSError as exc:
        sock.close()
        print(
            f"exactly console: error: cannot listen on {args.host}:{args.port}: {exc.strerror}",
            file=sys.stderr,
        )
        return 1
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    # a request waiting on a hung cluster must not hold up Ctrl-C until its timeout
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="on", timeout_graceful_shutdown=2
    )
    server = uvicorn.Server(config)
    print(f"exactly console: serving http://{shown}:{port}/ for {args.bootstrap_server}", flush=True)
    asyncio.run(server.serve(sockets=[sock]))
    return 0


_DESCRIPTION = """\
A live web page of what decides exactly-once: brokers and the controller, partitions with
high watermark, last stable offset and LastStableOffsetLag, the producers each partition
knows (DescribeProducers), transactions (ListTransactions/DescribeTransactions) with the
hanging ones highlighted and an abort action, consumer groups with their lag under
read_committed. Works against any Kafka-compatible cluster.

A transaction is highlighted as hanging when it has been open longer than its own timeout or
than --hanging-after-ms; so is a partition's open transaction that no coordinator will end
(KIP-664), found by asking the partition's leader before and after the coordinators.

example:
  exactly console --bootstrap-server 127.0.0.1:9092 --port 8090
  # then open http://127.0.0.1:8090/
  exactly console --bootstrap-server 127.0.0.1:9094 --command-config client.properties
  # a secured cluster: the same TLS/SASL settings as Kafka's tools take
"""


def register(subparsers: Any) -> None:
    p = strict(
        subparsers.add_parser(
            "console",
            help="serve a live web console of producers, transactions, LSOs and groups",
            description=_DESCRIPTION,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument(
        "--port",
        type=non_negative_int,
        default=DEFAULT_PORT,
        help=f"port (default {DEFAULT_PORT}; 0 = any free one)",
    )
    p.add_argument(
        "--refresh-ms",
        type=positive_int,
        default=2000,
        metavar="MS",
        help="page refresh interval (default 2000)",
    )
    p.add_argument(
        "--hanging-after-ms",
        type=non_negative_int,
        default=DEFAULT_HANGING_AFTER_MS,
        metavar="MS",
        help=f"highlight transactions open longer than this (default {DEFAULT_HANGING_AFTER_MS}, "
        "Kafka's transaction.max.timeout.ms)",
    )
    add_connection_options(p)
    p.set_defaults(func=cmd_console)
