"""`exactly` command line: one sub-command module per area, each exposing ``register(subparsers)``.

Modules: serve (the broker), topics (create/list/describe/delete), console (produce/consume),
txn / producers / groups (operations), pipeline (the Spark orders pipeline), zookeeper (a local
ZooKeeper for the cluster mode), web_console (``exactly console``, the live web page), users
(SCRAM credentials).

Start-up cost matters (tests and scripts run the CLI many times, and the Kafka schema library
alone takes about a second to import), so only the module of the command being run is imported;
``exactly --help`` or an unknown command imports them all to list every command.

``exactly --version`` prints the installed distribution's version (package metadata, what pip
installed), falling back to ``exactly.__version__`` when run from a source tree that is not
installed. Every command's ``--help`` ends with an example (``exactly.cli.examples``).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import exactly
from exactly.cli import examples

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
    "exactly.cli.users",
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
    "users": "exactly.cli.users",
}


def installed_version() -> str:
    """The version pip installed (the distribution's metadata), else the source tree's."""
    # imported here, not at the top: importlib.metadata costs every command (the broker's start
    # included) about 15 ms, and only --version needs it
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("exactly")
    except PackageNotFoundError:
        return f"{exactly.__version__} (source tree, not installed)"


class _VersionAction(argparse.Action):
    """``--version``: like argparse's own, but reads the version only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_args: Any, **_kwargs: Any) -> NoReturn:
        print(f"exactly {installed_version()}")
        parser.exit()


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="exactly", description="Kafka-compatible exactly-once broker")
    parser.add_argument("--version", action=_VersionAction, help="print the installed version and exit")
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
    examples.attach(parser)
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
