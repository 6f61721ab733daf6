"""`exactly` command line: one sub-command module per area, each exposing ``register(subparsers)``.

Modules: serve (the broker), topics (create/list/describe/delete), console (produce/consume).
Later areas (txn, groups, producers, pipeline) plug in the same way.
"""

from __future__ import annotations

import argparse
import importlib
import sys

_COMMAND_MODULES = (
    "exactly.cli.serve",
    "exactly.cli.topics",
    "exactly.cli.console",
    "exactly.cli.txn",
    "exactly.cli.producers",
    "exactly.cli.groups",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="exactly", description="Kafka-compatible exactly-once broker")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue  # area not built yet
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = args.func(args)
    except KeyboardInterrupt:
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
