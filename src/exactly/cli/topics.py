"""``exactly topics create|list|describe|alter|delete|delete-records``: topic administration over
the Kafka protocol.

``alter NAME --partitions N`` grows a topic to N partitions (CreatePartitions), like
``kafka-topics --alter --partitions N``; ``describe --json`` prints ``{"topics": [{"name",
"partition_count", "replication_factor", "configs", "compacted", "partitions": [{"partition",
"leader", "replicas", "isr", "dirty_ratio"}]}]}`` (``dirty_ratio`` null unless compacted and
known); ``delete-records NAME --offset O`` moves partitions' log
start offsets (DeleteRecords), like ``kafka-delete-records``.

Uses confluent-kafka's AdminClient, so it works against any Kafka-compatible broker. Every
failure (bad arguments, unreachable broker, broker error codes) ends with one line on stderr,
``exactly topics <action>: error: ...``, and exit code 1 - never a traceback.

The small helpers shared with ``exactly produce``/``exactly consume`` (strict argument parsing,
error reporting, client configuration) live here too, see ``console.py``.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from exactly.cli.output import add_json_option, print_json
from exactly.cli.security_options import add_security_options, security_config
from exactly.client.dirty_ratios import read_dirty_ratios
from exactly.client.security import ClientConfigError

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
DEFAULT_REQUEST_TIMEOUT = 30.0


class CliError(Exception):
    """A user-facing failure: printed as one line, exit code 1."""


# ---------------------------------------------------------------------- parsing helpers
class StrictParser(argparse.ArgumentParser):
    """An ArgumentParser that exits with code 1 (not 2) and rejects unknown arguments itself.

    Sub-command parsers are made by the dispatcher's parser class; ``strict`` swaps their class
    so that unrecognised arguments are reported by the sub-command (exit 1), not by the top level.
    """

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(1, f"{self.prog}: error: {message}\n")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        ns, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return ns, extras


def strict(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.__class__ = StrictParser
    return parser


def add_connection_options(parser: argparse.ArgumentParser, *, security: bool = True) -> None:
    """``--bootstrap-server``, ``--request-timeout`` and (unless ``security=False``, for a
    command that does not pass them on yet) ``--command-config``/``-X``."""
    parser.add_argument(
        "--bootstrap-server",
        default=DEFAULT_BOOTSTRAP,
        metavar="HOST:PORT",
        help=f"broker to connect to (default {DEFAULT_BOOTSTRAP})",
    )
    parser.add_argument(
        "--request-timeout",
        type=positive_float,
        default=DEFAULT_REQUEST_TIMEOUT,
        metavar="SECONDS",
        help=f"give up on the broker after this long (default {DEFAULT_REQUEST_TIMEOUT:g})",
    )
    if security:
        add_security_options(parser)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {text}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


# ---------------------------------------------------------------------- running helpers
Command = Callable[[argparse.Namespace], int]


def guarded(prog: str) -> Callable[[Command], Command]:
    """Turn CliError / Kafka errors raised by a command into one stderr line and exit code 1."""

    def wrap(func: Command) -> Command:
        @functools.wraps(func)
        def run(args: argparse.Namespace) -> int:
            try:
                return func(args)
            except (CliError, ClientConfigError) as exc:
                message = str(exc)
            except Exception as exc:  # a Kafka client error we did not map: still one line
                from confluent_kafka import KafkaException

                if not isinstance(exc, KafkaException):
                    raise
                message = describe_kafka_error(exc)
            print(f"{prog}: error: {message}", file=sys.stderr)
            return 1

        return run

    return wrap


def kafka_error_of(exc: BaseException) -> Any:
    """The KafkaError inside a KafkaException (or None)."""
    args = getattr(exc, "args", ())
    if args and hasattr(args[0], "code"):
        return args[0]
    return None


def describe_kafka_error(exc: BaseException) -> str:
    err = kafka_error_of(exc)
    if err is None:
        return str(exc) or type(exc).__name__
    return f"{err.name()}: {err.str()}"


class ErrorLog:
    """``error_cb`` for confluent-kafka clients: remembers the last client-level error."""

    def __init__(self) -> None:
        self.last: Any = None

    def __call__(self, err: Any) -> None:
        self.last = err

    def hint(self, bootstrap: str) -> str:
        if self.last is None:
            return f"no answer from {bootstrap}"
        return f"{bootstrap}: {self.last.str()}"


def client_config(args: argparse.Namespace, errors: ErrorLog, **extra: Any) -> dict[str, Any]:
    timeout_ms = int(args.request_timeout * 1000)
    conf: dict[str, Any] = {
        "bootstrap.servers": args.bootstrap_server,
        "client.id": "exactly-cli",
        "socket.timeout.ms": max(timeout_ms, 10),
        "log_level": 0,  # errors are reported through error_cb, as one line
        "error_cb": errors,
    }
    conf.update(security_config(args))
    conf.update(extra)
    return conf


def check_bootstrap(text: str) -> None:
    for part in text.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise CliError(f"invalid --bootstrap-server {text!r} (expected HOST:PORT)")


def fetch_metadata(client: Any, args: argparse.Namespace, errors: ErrorLog, topic: str | None = None) -> Any:
    try:
        if topic is None:
            return client.list_topics(timeout=args.request_timeout)
        return client.list_topics(topic=topic, timeout=args.request_timeout)
    except Exception as exc:
        err = kafka_error_of(exc)
        if err is not None and err.name() in ("_TRANSPORT", "_TIMED_OUT", "_ALL_BROKERS_DOWN"):
            hint = errors.hint(args.bootstrap_server)
            raise CliError(f"cannot get metadata from the broker ({hint})") from None
        raise


def topic_error(err: Any, topic: str) -> CliError:
    name = err.name()
    if name in ("UNKNOWN_TOPIC_OR_PART", "UNKNOWN_TOPIC_ID"):
        return CliError(f"topic '{topic}' does not exist")
    if name == "TOPIC_ALREADY_EXISTS":
        return CliError(f"topic '{topic}' already exists")
    if name == "TOPIC_EXCEPTION":  # librdkafka's name for INVALID_TOPIC_EXCEPTION (17)
        return CliError(f"invalid topic name '{topic}': {err.str()}")
    return CliError(f"{name}: {err.str()}")


def wait_future(future: Any, topic: str, args: argparse.Namespace, errors: ErrorLog) -> Any:
    try:
        return future.result(timeout=args.request_timeout + 5)
    except Exception as exc:
        err = kafka_error_of(exc)
        if err is None:
            if isinstance(exc, TimeoutError):  # concurrent.futures.TimeoutError is this one
                raise CliError(f"timed out ({errors.hint(args.bootstrap_server)})") from None
            raise
        if err.name() in ("_TRANSPORT", "_TIMED_OUT", "_ALL_BROKERS_DOWN"):
            raise CliError(f"request failed ({errors.hint(args.bootstrap_server)})") from None
        raise topic_error(err, topic) from None


def admin_client(args: argparse.Namespace, errors: ErrorLog) -> Any:
    from confluent_kafka.admin import AdminClient

    check_bootstrap(args.bootstrap_server)
    # An AdminClient is a producer-type handle: stop its metadata requests creating topics.
    return AdminClient(client_config(args, errors, **{"allow.auto.create.topics": False}))


# ---------------------------------------------------------------------- commands
@guarded("exactly topics create")
def cmd_create(args: argparse.Namespace) -> int:
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

    errors = ErrorLog()
    admin = admin_client(args, errors)
    configs = dict(args.config or [])
    new = NewTopic(
        args.name,
        num_partitions=args.partitions if args.partitions is not None else -1,
        replication_factor=args.replication_factor if args.replication_factor is not None else -1,
        config=configs,
    )
    futures = admin.create_topics([new], request_timeout=args.request_timeout)
    wait_future(futures[args.name], args.name, args, errors)
    print(f"Created topic {args.name}.")
    return 0


@guarded("exactly topics list")
def cmd_list(args: argparse.Namespace) -> int:
    errors = ErrorLog()
    admin = admin_client(args, errors)
    metadata = fetch_metadata(admin, args, errors)
    for name in sorted(metadata.topics):
        print(name)
    return 0


def _topic_configs(admin: Any, name: str, args: argparse.Namespace, errors: ErrorLog) -> dict[str, str]:
    """The topic's non-default configs (what was set on it)."""
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        ConfigResource,
        ConfigSource,
        ResourceType,
    )

    resource = ConfigResource(ResourceType.TOPIC, name)
    futures = admin.describe_configs([resource], request_timeout=args.request_timeout)
    entries = wait_future(futures[resource], name, args, errors)
    out: dict[str, str] = {}
    for entry in entries.values():
        if entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value and not entry.is_default:
            out[entry.name] = "(sensitive)" if entry.is_sensitive else str(entry.value)
    return out


@guarded("exactly topics describe")
def cmd_describe(args: argparse.Namespace) -> int:
    errors = ErrorLog()
    admin = admin_client(args, errors)
    metadata = fetch_metadata(admin, args, errors, args.name)
    if args.name is not None:
        tmeta = metadata.topics.get(args.name)
        if tmeta is None:
            raise CliError(f"topic '{args.name}' does not exist")
        if tmeta.error is not None:
            raise topic_error(tmeta.error, args.name)
        names = [args.name]
    else:
        names = sorted(n for n, t in metadata.topics.items() if t.error is None)
    leaders: dict[int, set[str]] = {}
    for name in names:
        for p in metadata.topics[name].partitions.values():
            if p.leader >= 0:
                leaders.setdefault(p.leader, set()).add(name)
    compacted, ratios = read_dirty_ratios(
        args.bootstrap_server, leaders, timeout_s=args.request_timeout, config=security_config(args)
    )
    described = []
    for name in names:
        tmeta = metadata.topics[name]
        partitions = [tmeta.partitions[p] for p in sorted(tmeta.partitions)]
        described.append(
            {
                "name": name,
                "partition_count": len(partitions),
                "replication_factor": max((len(p.replicas) for p in partitions), default=0),
                "configs": _topic_configs(admin, name, args, errors),
                "compacted": name in compacted,
                "partitions": [
                    {
                        "partition": p.id,
                        "leader": p.leader,
                        "replicas": list(p.replicas),
                        "isr": list(p.isrs),
                        "dirty_ratio": ratios.get((name, p.id)),
                    }
                    for p in partitions
                ],
            }
        )
    if args.json:
        print_json({"topics": described})
    elif described:
        print("\n".join(_describe_lines(described)))
    return 0


def _describe_lines(described: list[dict[str, Any]]) -> list[str]:
    """kafka-topics --describe's layout, plus DirtyRatio on compacted topics' partitions."""
    lines: list[str] = []
    for topic in described:
        name = topic["name"]
        config_text = ",".join(f"{k}={v}" for k, v in sorted(topic["configs"].items()))
        lines.append(
            f"Topic: {name}\tPartitionCount: {topic['partition_count']}\t"
            f"ReplicationFactor: {topic['replication_factor']}\tConfigs: {config_text}"
        )
        for p in topic["partitions"]:
            line = (
                f"\tTopic: {name}\tPartition: {p['partition']}\tLeader: {p['leader']}\t"
                f"Replicas: {','.join(map(str, p['replicas']))}\tIsr: {','.join(map(str, p['isr']))}"
            )
            if topic["compacted"]:
                ratio = p["dirty_ratio"]
                line += f"\tDirtyRatio: {'-' if ratio is None else f'{ratio:.4f}'}"
            lines.append(line)
    return lines


@guarded("exactly topics alter")
def cmd_alter(args: argparse.Namespace) -> int:
    from confluent_kafka.admin import NewPartitions  # type: ignore[attr-defined]

    errors = ErrorLog()
    admin = admin_client(args, errors)
    futures = admin.create_partitions(
        [NewPartitions(args.name, args.partitions)],
        operation_timeout=args.request_timeout,
        request_timeout=args.request_timeout,
    )
    wait_future(futures[args.name], args.name, args, errors)
    print(f"Topic {args.name} now has {args.partitions} partitions.")
    return 0


@guarded("exactly topics delete")
def cmd_delete(args: argparse.Namespace) -> int:
    errors = ErrorLog()
    admin = admin_client(args, errors)
    futures = admin.delete_topics([args.name], request_timeout=args.request_timeout)
    wait_future(futures[args.name], args.name, args, errors)
    print(f"Deleted topic {args.name}.")
    return 0


def offset_or_end(text: str) -> int:
    """A DeleteRecords offset: >= 0, or -1 / ``end`` for the high watermark."""
    if text.strip().lower() in ("end", "-1"):
        return -1
    return non_negative_int(text)


@guarded("exactly topics delete-records")
def cmd_delete_records(args: argparse.Namespace) -> int:
    """Kafka's kafka-delete-records: move the log start offset of one or more partitions of a
    topic up to OFFSET (records below it are no longer readable)."""
    from confluent_kafka import TopicPartition

    errors = ErrorLog()
    admin = admin_client(args, errors)
    partitions = args.partition or [0]
    wanted = [TopicPartition(args.name, p, args.offset) for p in sorted(set(partitions))]
    futures = admin.delete_records(
        wanted, request_timeout=args.request_timeout, operation_timeout=args.request_timeout
    )
    for tp in wanted:
        try:
            deleted = futures[tp].result(timeout=args.request_timeout + 5)
        except Exception as exc:
            err = kafka_error_of(exc)
            if err is not None and err.name() == "OFFSET_OUT_OF_RANGE":
                raise CliError(
                    f"partition {tp.partition}: offset {args.offset} is beyond the high watermark"
                ) from None
            if err is not None and err.name() in ("_NOENT", "UNKNOWN_TOPIC_OR_PART"):
                # librdkafka finds no leader for a partition that does not exist
                raise CliError(f"topic '{args.name}' has no partition {tp.partition}") from None
            if err is not None and err.name() == "POLICY_VIOLATION":
                raise CliError(
                    f"topic '{args.name}': records cannot be deleted (cleanup.policy has no delete)"
                ) from None
            wait_future(futures[tp], args.name, args, errors)  # re-raises as a CliError
            raise
        print(f"Partition {tp.partition}: low watermark {deleted.low_watermark}")
    return 0


def register(subparsers: Any) -> None:
    topics = strict(
        subparsers.add_parser(
            "topics", help="create, list, describe, alter and delete topics, delete records"
        )
    )
    actions = topics.add_subparsers(dest="topics_action", metavar="ACTION", parser_class=StrictParser)
    actions.required = True

    create = actions.add_parser("create", help="create a topic")
    create.add_argument("name", metavar="NAME")
    create.add_argument("--partitions", type=positive_int, help="number of partitions (default: broker's)")
    create.add_argument(
        "--replication-factor", type=positive_int, help="replication factor (default: broker's)"
    )
    create.add_argument(
        "--config", type=key_value, action="append", metavar="KEY=VALUE", help="topic config (repeatable)"
    )
    add_connection_options(create)
    create.set_defaults(func=cmd_create)

    list_ = actions.add_parser("list", help="list topic names")
    add_connection_options(list_)
    list_.set_defaults(func=cmd_list)

    describe = actions.add_parser("describe", help="partitions, leaders and configs of topics")
    describe.add_argument("name", metavar="NAME", nargs="?", help="one topic (default: all)")
    add_json_option(describe)
    add_connection_options(describe)
    describe.set_defaults(func=cmd_describe)

    alter = actions.add_parser("alter", help="add partitions to a topic")
    alter.add_argument("name", metavar="NAME")
    alter.add_argument(
        "--partitions", type=positive_int, required=True, help="the new partition count (only grows)"
    )
    add_connection_options(alter)
    alter.set_defaults(func=cmd_alter)

    delete = actions.add_parser("delete", help="delete a topic")
    delete.add_argument("name", metavar="NAME")
    add_connection_options(delete)
    delete.set_defaults(func=cmd_delete)

    records = actions.add_parser(
        "delete-records", help="delete the records of partitions below an offset (DeleteRecords)"
    )
    records.add_argument("name", metavar="TOPIC")
    records.add_argument(
        "--partition",
        type=non_negative_int,
        action="append",
        metavar="P",
        help="partition (repeatable; default 0)",
    )
    records.add_argument(
        "--offset",
        type=offset_or_end,
        required=True,
        metavar="OFFSET",
        help="new log start offset: records below it go; -1 or 'end' for the high watermark",
    )
    add_connection_options(records)
    records.set_defaults(func=cmd_delete_records)
