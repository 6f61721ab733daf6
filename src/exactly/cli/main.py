"""`exactly` command line: one sub-command module per area, each exposing ``register(subparsers)``.

Modules: serve (the broker), topics (create/list/describe/delete), console (produce/consume),
txn / producers / groups (operations), pipeline (the Spark orders pipeline), zookeeper (a local
ZooKeeper for the cluster mode), web_console (``exactly console``, the live web page).

Start-up cost matters (tests and scripts run the CLI many times, and the Kafka schema library
alone takes about a second to import), so only the module of the command being run is imported;
``exactly --help`` or an unknown command imports them all to list every command.
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
    "exactly.cli.pipeline",
    "exactly.cli.zookeeper",
    "exactly.cli.cluster",
    "exactly.cli.web_console",
    "exactly.cli.acls",
)

# command name -> the module that registers it (modules may register several commands)
_COMMAND_OWNER = {
    "serve": "exactly.cli.serve",
    "topics": "exactly.cli.topics",
    "produce": "exactly.cli.console",
    "consume": "exactly.cli.console",
    "txn": "exactly.cli.txn",
    "producers": "exactly.cli.producers",
    "groups": "exactly.cli.groups",
    "pipeline": "exactly.cli.pipeline",
    "zookeeper": "exactly.cli.zookeeper",
    "cluster": "exactly.cli.cluster",
    "console": "exactly.cli.web_console",
    "acls": "exactly.cli.acls",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="exactly", description="Kafka-compatible exactly-once broker")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    owner = _COMMAND_OWNER.get(command or "")
    for name in (owner,) if owner else _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue  # area not built yet
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    first = next((a for a in args_in if not a.startswith("-")), None)
    parser = build_parser(first)
    args = parser.parse_args(args_in)
    try:
        result = args.func(args)
    except KeyboardInterrupt:
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
