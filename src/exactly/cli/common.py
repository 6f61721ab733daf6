"""Helpers every broker-facing ``exactly`` command shares: strict argument parsing, the
connection and security options, one-line error reporting (``exactly <cmd>: error: ...``, exit
code 1, never a traceback) and the confluent-kafka client configuration.

They used to live in ``topics.py``; every command module imports them from here.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from exactly.cli.security_options import add_security_options, security_config
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
