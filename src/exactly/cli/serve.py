"""`exactly serve`: run the broker until SIGTERM/SIGINT (clean shutdown) or kill -9 (crash;
the next start recovers the data directory)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

from exactly.cli.overrides import parse_overrides

# one line per listener (``exactly listener SASL_SSL on 127.0.0.1:9094``), printed before the
# ``exactly listening on HOST:PORT`` line of the first listener
LISTENER_PREFIX = "exactly listener "


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="run the broker")
    p.add_argument(
        "--listen",
        default=None,
        help="HOST:PORT of a PLAINTEXT listener (default 127.0.0.1:9092; port 0 picks one); "
        "for several listeners or TLS/SASL use -o listeners=NAME://HOST:PORT,... instead",
    )
    p.add_argument("--data-dir", default=None, help="data directory (default ./data, or log.dirs)")
    p.add_argument(
        "--config", type=Path, default=None, help="server.properties-style file (Kafka config names)"
    )
    p.add_argument(
        "-o",
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="broker config by Kafka name",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="N",
        help="serve Prometheus /metrics on 127.0.0.1:N (metrics.port; 0 picks a free port)",
    )
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.set_defaults(func=run)


def _without_hypothesis() -> None:
    """kio (the protocol schemas) registers Hypothesis strategies for its types whenever
    ``hypothesis`` is importable, which costs 0.1-0.3 s of the broker's start in any environment
    that has it (every test venv). A broker process never generates test data: mark the module
    missing before kio is imported, unless something already imported it."""
    sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]


def run(args: argparse.Namespace) -> int:
    _without_hypothesis()
    from exactly.server.config import BrokerConfig, ConfigError

    logging.basicConfig(
        level=getattr(logging, args.log_level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    overrides = parse_overrides(args.override, "serve")
    if overrides is None:
        return 2
    if args.listen:
        if "listeners" in overrides:
            print("exactly serve: give --listen or -o listeners=..., not both", file=sys.stderr)
            return 2
        overrides["listeners"] = f"PLAINTEXT://{args.listen}"
    if args.data_dir:
        overrides["log.dirs"] = args.data_dir
    if args.metrics_port is not None:
        overrides["metrics.port"] = str(args.metrics_port)
    try:
        config = BrokerConfig.load(args.config, overrides)
        config.metrics_port()  # validate metrics.port before anything starts
    except (ConfigError, OSError) as exc:
        print(f"exactly serve: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a dependency; asyncio still works
        pass
    return asyncio.run(_serve(config))


@contextlib.contextmanager
def _startup_heap() -> Iterator[None]:
    """No cyclic garbage collection while the logs open and the coordinators replay their
    topics, and what start-up built frozen out of every later collection (``gc.freeze``).

    Why: a restart allocates the whole loaded state (every group's offsets, every producer and
    transactional id) in one go; the collector, triggered by allocation counts, traverses that
    growing heap again and again (measured: 150 collections, ~0.1-0.2 s of a 3-4 s restart on a
    loaded box, the longest 30-60 ms) and, once running, pays a full traversal of it at every
    later generation-2 collection: an event-loop pause in the produce path. The state is
    long-lived by design, so it is left out. Cost: cyclic garbage made during start-up (if any)
    is never collected; that is bounded by one start-up. Reference counting frees everything
    else as usual. Without the freeze, each full collection stopped the event loop for 13-46 ms
    in the middle of serving (traced at 1,000 acks=all produces/s on a 3-broker cluster), the
    tail of every latency figure."""
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


async def _serve(config: object) -> int:
    from exactly.server.broker import Broker
    from exactly.server.config import BrokerConfig, ConfigError

    assert isinstance(config, BrokerConfig)
    data_dir = Path(config.get("log.dirs").split(",")[0])
    try:
        with _startup_heap():
            broker = Broker.open(config, data_dir)
            bound = await broker.start()
    except ConfigError as exc:  # a value the subsystems refuse (e.g. a retention below 1)
        print(f"exactly serve: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"exactly serve: {exc}", file=sys.stderr)
        return 1
    for name, endpoint in broker.bound.items():  # before the line launchers wait for
        print(f"{LISTENER_PREFIX}{name} on {endpoint.host}:{endpoint.port}", flush=True)
    print(f"exactly listening on {bound.host}:{bound.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await broker.shutdown()
    return 0
