"""An ``Example`` section at the end of every command's ``--help``.

The examples live in one table, keyed by the command's words after ``exactly`` (``""`` is the top
level), and :func:`attach` puts them on the parsers once every command is registered. A command
without an entry keeps its help as it was; ``tests/cli/test_help.py`` walks every command and
sub-command and fails on one without an ``Example`` section, so a new command needs a line here.

The section is printed as written (indentation and line breaks kept), while descriptions are
still wrapped as argparse does (:class:`ExampleFormatter`).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

__all__ = ["EXAMPLES", "ExampleFormatter", "attach", "walk"]

_BS = "--bootstrap-server 127.0.0.1:9092"

EXAMPLES: dict[str, str] = {
    "": f"exactly serve --data-dir ./data &\n  exactly topics create orders --partitions 3 {_BS}",
    "serve": "exactly serve --listen 127.0.0.1:9092 --data-dir ./data -o log.retention.ms=3600000",
    "topics": f"exactly topics describe orders {_BS} --json",
    "topics create": f"exactly topics create orders --partitions 3 --config cleanup.policy=compact {_BS}",
    "topics list": f"exactly topics list {_BS}",
    "topics describe": f"exactly topics describe orders {_BS}\n  exactly topics describe --json | jq '.topics[].name'",
    "topics alter": f"exactly topics alter orders --partitions 6 {_BS}",
    "topics delete": f"exactly topics delete orders {_BS}",
    "topics delete-records": f"exactly topics delete-records orders --partition 0 --offset 1000 {_BS}",
    "produce": (
        "printf 'k1:hello\\nk2:world\\n' | exactly produce orders --key-separator :\n"
        "  exactly produce orders --file orders.txt --quiet"
    ),
    "consume": "exactly consume orders --from-beginning --print-key --max-messages 10",
    "txn": f"exactly txn list --state Ongoing {_BS} --json",
    "txn list": (
        "exactly txn list --state Ongoing --duration-ms 60000\n  exactly txn list --json\n"
        "  exactly txn list --bootstrap-server 127.0.0.1:9094 -X security.protocol=SASL_SSL "
        "-X sasl.mechanism=SCRAM-SHA-512 -X sasl.username=ops -X sasl.password=... -X ssl.ca.location=ca.pem"
    ),
    "txn describe": "exactly txn describe payments-1 payments-2 --json",
    "txn abort": (
        "exactly txn abort --transactional-id payments-1\n"
        "  exactly txn abort --topic orders --partition 0 --producer-id 4000"
    ),
    "txn find-hanging": "exactly txn find-hanging --max-age-ms 600000 --topic orders",
    "producers": f"exactly producers orders 0 {_BS}\n  exactly producers orders 0 --json",
    "groups": f"exactly groups describe billing {_BS} --json",
    "groups list": "exactly groups list --json",
    "groups describe": "exactly groups describe billing\n  exactly groups describe billing --json",
    "pipeline": f"exactly pipeline generate --orders 10000 {_BS}",
    "pipeline generate": f"exactly pipeline generate --orders 10000 --txn-size 100 {_BS}",
    "pipeline run": f"exactly pipeline run --checkpoint ./checkpoint --trigger availableNow {_BS}",
    "pipeline demo": "exactly pipeline demo --orders 5000\n  exactly pipeline demo --cluster 3 --kill-broker-after 5",
    "pipeline verify": f"exactly pipeline verify {_BS} --json",
    "zookeeper": "exactly zookeeper --data-dir ./zk --port 2181",
    "console": (
        f"exactly console {_BS} --port 8090   # then open http://127.0.0.1:8090/\n"
        "  exactly console --bootstrap-server 127.0.0.1:9094 --command-config client.properties   # TLS/SASL"
    ),
    "acls": (
        f"exactly acls --add --allow-principal User:billing --producer --topic orders "
        f"--transactional-id billing- --resource-pattern-type prefixed {_BS}\n"
        "  exactly acls --list --topic orders\n"
        "  exactly acls --list --command-config admin.properties   # a SASL_SSL listener, as kafka-acls.sh"
    ),
    "users": f"printf 'alice-secret\\n' | exactly users add alice --password-stdin {_BS}",
    "users add": (
        "printf 'alice-secret\\n' | exactly users add alice --password-stdin --mechanism SCRAM-SHA-512\n"
        "  exactly users add alice --password-stdin --command-config admin.properties   # a SASL_SSL listener"
    ),
    "users delete": f"exactly users delete alice --mechanism SCRAM-SHA-256 {_BS}",
    "users list": f"exactly users list {_BS}",
    "cluster": "exactly cluster --brokers 3 --data-dir ./cluster",
    "cluster verify-replicas": f"exactly cluster verify-replicas {_BS} --topic orders",
    "cluster status": f"exactly cluster status {_BS} --json",
}


class ExampleFormatter(argparse.HelpFormatter):
    """argparse's formatter, except that the ``Example`` epilog is kept as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("Example"):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def walk(parser: argparse.ArgumentParser, path: str = "") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every (command words, parser) under ``parser``, the parser itself first."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk(sub, f"{path} {name}".strip())


def attach(parser: argparse.ArgumentParser) -> None:
    """Give every registered command that has an entry in :data:`EXAMPLES` its section."""
    for path, command in walk(parser):
        example = EXAMPLES.get(path)
        if example is None or command.epilog:
            continue
        command.epilog = f"Example:\n  {example}"
        if command.formatter_class is argparse.HelpFormatter:
            command.formatter_class = ExampleFormatter
