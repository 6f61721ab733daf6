"""``exactly produce`` and ``exactly consume``: console clients (confluent-kafka underneath).

produce
    Reads stdin (or ``--file PATH``) line by line, one record per line (the trailing newline is not
    part of the value).
    With ``--key-separator SEP`` each line is ``KEY<SEP>VALUE`` (split at the first SEP; a line
    without SEP is an error). Idempotent with acks=all by default. Exits 1 if any record was not
    acknowledged. Progress goes to stderr (see ``exactly.cli.progress``): by bytes with a bar
    and ETA when the input's size is known (a file, or stdin redirected from one), else a count of
    records; none when stdin is a terminal or with ``--quiet``.

consume
    Assigns the topic's partitions (or ``--partition P``) - no consumer group - and prints one
    record per line: ``[Partition:P<TAB>Offset:O<TAB>][KEY<TAB>]VALUE`` (null as ``null``).
    Starts at the end by default, at the beginning with ``--from-beginning``, or at ``--offset N``.
    Stops after ``--max-messages N`` records, or when nothing arrived for ``--timeout S`` seconds,
    or on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import stat
import sys
import time
import uuid
from typing import IO, Any

from exactly.cli.common import (
    CliError,
    ErrorLog,
    add_connection_options,
    check_bootstrap,
    client_config,
    fetch_metadata,
    guarded,
    non_negative_int,
    positive_float,
    positive_int,
    strict,
    topic_error,
)
from exactly.cli.progress import Tracker, progress

_TRANSIENT_TOPIC_ERRORS = ("LEADER_NOT_AVAILABLE", "NOT_LEADER_FOR_PARTITION", "_WAIT_COORD")


def _partitions_of(metadata: Any, topic: str, allow_missing: bool) -> list[int]:
    tmeta = metadata.topics.get(topic)
    if tmeta is None:
        if allow_missing:
            return []
        raise CliError(f"topic '{topic}' does not exist")
    if tmeta.error is not None and tmeta.error.name() not in _TRANSIENT_TOPIC_ERRORS:
        raise topic_error(tmeta.error, topic)
    return sorted(tmeta.partitions)


# ---------------------------------------------------------------------- produce
def _acks(text: str) -> str:
    value = text.strip().lower()
    if value in ("all", "-1"):
        return "all"
    if value in ("0", "1"):
        return value
    raise argparse.ArgumentTypeError(f"acks must be 0, 1 or all, got {text!r}")


class _Deliveries:
    def __init__(self) -> None:
        self.acked = 0
        self.failed = 0
        self.first_error: str | None = None

    def __call__(self, err: Any, msg: Any) -> None:
        if err is None:
            self.acked += 1
            return
        self.failed += 1
        if self.first_error is None:
            self.first_error = f"{err.name()}: {err.str()}"


def _split(line: bytes, separator: bytes | None, number: int) -> tuple[bytes | None, bytes]:
    if separator is None:
        return None, line
    key, sep, value = line.partition(separator)
    if not sep:
        raise CliError(f"line {number} has no key separator {separator.decode()!r}")
    return key, value


@guarded("exactly produce")
def cmd_produce(args: argparse.Namespace) -> int:
    from confluent_kafka import Producer

    check_bootstrap(args.bootstrap_server)
    if args.idempotent and args.acks != "all":
        raise CliError("--idempotent needs --acks all (or use --no-idempotent)")
    if args.key_separator == "":
        raise CliError("--key-separator must not be empty")
    errors = ErrorLog()
    timeout_ms = int(args.request_timeout * 1000)
    producer = Producer(
        client_config(
            args,
            errors,
            **{
                "enable.idempotence": args.idempotent,
                "acks": args.acks,
                "linger.ms": 5,
                "message.timeout.ms": max(timeout_ms, 1000),
                "request.timeout.ms": max(min(timeout_ms, 30_000), 1000),
            },
        )
    )
    metadata = fetch_metadata(producer, args, errors, args.topic)
    partitions = _partitions_of(metadata, args.topic, allow_missing=True)
    if args.partition is not None and partitions and args.partition not in partitions:
        raise CliError(f"topic '{args.topic}' has no partition {args.partition} (it has {len(partitions)})")

    with contextlib.ExitStack() as stack:
        source = stack.enter_context(_open_input(args.file)) if args.file else sys.stdin.buffer
        size = _input_size(source)
        tracker = stack.enter_context(
            progress(
                f"produce {args.topic}",
                size,
                unit="bytes" if size else "records",
                quiet=args.quiet or source.isatty(),
            )
        )
        deliveries = _produce_lines(args, producer, source, tracker)
    remaining = producer.flush(args.request_timeout + 5)
    if deliveries.failed:
        raise CliError(f"{deliveries.failed} record(s) not written: {deliveries.first_error}")
    if remaining:
        hint = errors.hint(args.bootstrap_server)
        raise CliError(f"{remaining} record(s) not acknowledged in time ({hint})")
    return 0


def _open_input(path: str) -> IO[bytes]:
    try:
        return open(path, "rb")
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from None


def _input_size(source: IO[bytes]) -> int | None:
    """Bytes in the input when it is a regular file (a pipe's length is unknown)."""
    try:
        info = os.fstat(source.fileno())
    except (OSError, ValueError):
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) and info.st_size > 0 else None


def _produce_lines(
    args: argparse.Namespace, producer: Any, source: IO[bytes], tracker: Tracker
) -> _Deliveries:
    deliveries = _Deliveries()
    separator = args.key_separator.encode() if args.key_separator is not None else None
    extra: dict[str, Any] = {} if args.partition is None else {"partition": args.partition}
    by_bytes = tracker.total is not None
    for number, raw in enumerate(source, start=1):
        line = raw[:-1] if raw.endswith(b"\n") else raw
        if line.endswith(b"\r"):
            line = line[:-1]
        key, value = _split(line, separator, number)
        while True:
            try:
                producer.produce(args.topic, value=value, key=key, on_delivery=deliveries, **extra)
                break
            except BufferError:  # local queue full: let deliveries drain
                producer.poll(0.1)
        producer.poll(0)
        tracker.advance(len(raw) if by_bytes else 1)
        if deliveries.failed:
            break
    return deliveries


# ---------------------------------------------------------------------- consume
def _format(msg: Any, print_key: bool, print_offset: bool) -> bytes:
    parts: list[bytes] = []
    if print_offset:
        parts.append(f"Partition:{msg.partition()}\tOffset:{msg.offset()}".encode())
    if print_key:
        key = msg.key()
        parts.append(b"null" if key is None else key)
    value = msg.value()
    parts.append(b"null" if value is None else value)
    return b"\t".join(parts) + b"\n"


@guarded("exactly consume")
def cmd_consume(args: argparse.Namespace) -> int:
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, TopicPartition

    check_bootstrap(args.bootstrap_server)
    errors = ErrorLog()
    consumer = Consumer(
        client_config(
            args,
            errors,
            **{
                # librdkafka needs a group id even for assign(); nothing is ever committed.
                "group.id": f"exactly-console-{uuid.uuid4().hex[:12]}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "isolation.level": args.isolation_level,
                "auto.offset.reset": "earliest" if args.from_beginning else "latest",
                "enable.partition.eof": False,
                "allow.auto.create.topics": False,
            },
        )
    )
    try:
        metadata = fetch_metadata(consumer, args, errors, args.topic)
        partitions = _partitions_of(metadata, args.topic, allow_missing=False)
        if args.partition is not None:
            if args.partition not in partitions:
                raise CliError(
                    f"topic '{args.topic}' has no partition {args.partition} (it has {len(partitions)})"
                )
            partitions = [args.partition]
        if args.from_beginning:
            start = OFFSET_BEGINNING
        elif args.offset is not None:
            start = args.offset
        else:
            start = OFFSET_END
        consumer.assign([TopicPartition(args.topic, p, start) for p in partitions])
        out = sys.stdout.buffer
        count = 0
        last = time.monotonic()
        while args.max_messages is None or count < args.max_messages:
            msg = consumer.poll(0.1)
            if msg is None:
                if args.timeout is not None and time.monotonic() - last >= args.timeout:
                    break
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                raise CliError(f"{err.name()}: {err.str()}")
            try:
                out.write(_format(msg, args.print_key, args.print_offset))
                out.flush()
            except BrokenPipeError:
                return 0
            count += 1
            last = time.monotonic()
        return 0
    finally:
        consumer.close()


def register(subparsers: Any) -> None:
    produce = strict(subparsers.add_parser("produce", help="write stdin (or a file's) lines to a topic"))
    produce.add_argument("topic", metavar="TOPIC")
    produce.add_argument("--file", metavar="PATH", help="read the lines from this file instead of stdin")
    produce.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    produce.add_argument("--key-separator", metavar="SEP", help="lines are KEY<SEP>VALUE")
    produce.add_argument("--partition", type=non_negative_int, metavar="P", help="write to this partition")
    produce.add_argument("--acks", type=_acks, default="all", help="0, 1 or all (default all)")
    produce.add_argument(
        "--idempotent",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="idempotent producer (default on)",
    )
    add_connection_options(produce)
    produce.set_defaults(func=cmd_produce)

    consume = strict(subparsers.add_parser("consume", help="print records of a topic"))
    consume.add_argument("topic", metavar="TOPIC")
    start = consume.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true", help="start at the earliest offset")
    start.add_argument("--offset", type=non_negative_int, metavar="N", help="start at offset N")
    consume.add_argument("--partition", type=non_negative_int, metavar="P", help="only this partition")
    consume.add_argument("--max-messages", type=positive_int, metavar="N", help="stop after N records")
    consume.add_argument(
        "--isolation-level",
        choices=("read_committed", "read_uncommitted"),
        default="read_committed",
        help="default read_committed",
    )
    consume.add_argument(
        "--timeout", type=positive_float, metavar="S", help="stop when no record arrived for S seconds"
    )
    consume.add_argument("--print-key", action="store_true", help="print KEY<TAB>VALUE")
    consume.add_argument("--print-offset", action="store_true", help="prefix Partition:P<TAB>Offset:O<TAB>")
    add_connection_options(consume)
    consume.set_defaults(func=cmd_consume)
