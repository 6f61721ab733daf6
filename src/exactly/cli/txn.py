"""``exactly txn list|describe|abort|find-hanging``: transaction administration (KIP-664).

Speaks the Kafka protocol directly (``exactly.client``): ListTransactions, DescribeTransactions,
DescribeProducers, InitProducerId and WriteTxnMarkers, which librdkafka's AdminClient does not
offer. Output is tab-separated with a header line, or with ``--json`` (list, describe,
find-hanging) one JSON document with stable keys (``exactly.cli.output``). Every failure is one line on stderr,
``exactly txn <action>: error: ...``, and exit code 1.

Two ways to abort:

``exactly txn abort --transactional-id ID``
    The normal way. Sends InitProducerId with that transactional.id, as a new producer
    instance would: the coordinator aborts the open transaction (ABORT markers on every partition
    in it) and bumps the producer epoch, so the producer that held the id is fenced - its next
    commit fails with PRODUCER_FENCED.

``exactly txn abort --topic T --partition P [--producer-id N]``
    For a hanging transaction (KIP-664): a partition holds an open transaction that its
    coordinator no longer tracks, so the LSO is stuck and read_committed consumers stall. Finds
    the producer with an open transaction there (DescribeProducers) and writes an ABORT marker
    for it directly to the partition (WriteTxnMarkers). The coordinator is not involved.

On a cluster every request goes where Kafka's admin client sends it
(``exactly.client.broker_pool``): DescribeProducers and WriteTxnMarkers to the partition's
leader, DescribeTransactions and InitProducerId to the id's coordinator (FindCoordinator),
ListTransactions to every broker, merged. ``find-hanging`` is Kafka's: open transactions found
at the partitions' leaders, compared with what the coordinators track.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from typing import Any

from exactly.cli.common import (
    CliError,
    StrictParser,
    add_connection_options,
    guarded,
    non_negative_int,
    strict,
)
from exactly.cli.output import add_json_option, print_json
from exactly.cli.security_options import security_config
from exactly.client import txn_admin
from exactly.client.broker_pool import BrokerPool
from exactly.client.wire import DescribedTransactionState, WireError, error_name

Command = Callable[[argparse.Namespace], int]


def wire_command(prog: str) -> Callable[[Callable[[argparse.Namespace, BrokerPool], int]], Command]:
    """A command that gets a :class:`BrokerPool` connected to the bootstrap servers (requests
    are routed to leaders and coordinators from there); wire errors become one-line CLI errors."""

    def wrap(func: Callable[[argparse.Namespace, BrokerPool], int]) -> Command:
        @guarded(prog)
        @functools.wraps(func)
        def run(args: argparse.Namespace) -> int:
            try:
                with BrokerPool.connect(
                    args.bootstrap_server, timeout=args.request_timeout, config=security_config(args)
                ) as pool:
                    return func(args, pool)
            except WireError as exc:
                raise CliError(str(exc)) from None

        return run

    return wrap


def print_table(header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
    lines = ["\t".join(header)]
    lines.extend("\t".join(str(v) for v in row) for row in rows)
    print("\n".join(lines), flush=True)


def _none(value: Any) -> str:
    return "None" if value is None else str(value)


def _described(state: DescribedTransactionState, now: int) -> dict[str, Any]:
    """One DescribeTransactions entry as the JSON document's keys (the table shows the same).
    The start time is null without a transaction, the duration null unless one is open."""
    start = state.transaction_start_time_ms
    open_ = start >= 0 and txn_admin.is_open(state)
    return {
        "transactional_id": state.transactional_id,
        "producer_id": state.producer_id,
        "producer_epoch": state.producer_epoch,
        "state": state.transaction_state,
        "timeout_ms": state.transaction_timeout_ms,
        "start_time_ms": start if start >= 0 else None,
        "duration_ms": max(now - start, 0) if open_ else None,
        "partitions": [{"topic": t.topic, "partition": p} for t in state.topics for p in t.partitions],
    }


# ---------------------------------------------------------------------- commands
@wire_command("exactly txn list")
def cmd_list(args: argparse.Namespace, pool: BrokerPool) -> int:
    listed = txn_admin.list_transactions(
        pool,
        states=tuple(args.state or ()),
        producer_ids=tuple(args.producer_id or ()),
        duration_ms=-1 if args.duration_ms is None else args.duration_ms,
    )
    if args.json:
        print_json(
            {
                "transactions": [
                    {"transactional_id": t.transactional_id, "producer_id": t.producer_id, "state": t.state}
                    for t in listed
                ]
            }
        )
        return 0
    print_table(
        ("TransactionalId", "ProducerId", "TransactionState"),
        [(t.transactional_id, t.producer_id, t.state) for t in listed],
    )
    return 0


@wire_command("exactly txn describe")
def cmd_describe(args: argparse.Namespace, pool: BrokerPool) -> int:
    ids = list(dict.fromkeys(args.transactional_ids))
    states = txn_admin.describe_transactions(pool, ids)
    now = txn_admin.now_ms()
    rows: list[dict[str, Any]] = []
    missing: list[str] = []
    failed: list[str] = []
    for state in states:
        if state.error_code:
            code = error_name(state.error_code)
            if code == "TRANSACTIONAL_ID_NOT_FOUND":
                missing.append(state.transactional_id)
            else:
                failed.append(f"{state.transactional_id}: {code}")
            continue
        rows.append(_described(state, now))
    if args.json:
        print_json({"transactions": rows})
    elif rows:
        print_table(
            (
                "TransactionalId",
                "ProducerId",
                "ProducerEpoch",
                "TransactionState",
                "TransactionTimeoutMs",
                "CurrentTransactionStartTimeMs",
                "TransactionDurationMs",
                "TopicPartitions",
            ),
            [
                (
                    r["transactional_id"],
                    r["producer_id"],
                    r["producer_epoch"],
                    r["state"],
                    r["timeout_ms"],
                    _none(r["start_time_ms"]),
                    _none(r["duration_ms"]),
                    ",".join(f"{p['topic']}-{p['partition']}" for p in r["partitions"]) or "None",
                )
                for r in rows
            ],
        )
    problems = []
    if missing:
        problems.append(f"transactional id(s) not found: {', '.join(missing)}")
    if failed:
        problems.append(f"cannot describe {'; '.join(failed)}")
    if problems:
        raise CliError("; ".join(problems))
    return 0


@wire_command("exactly txn abort")
def cmd_abort(args: argparse.Namespace, pool: BrokerPool) -> int:
    if args.transactional_id is not None:
        if args.topic is not None or args.partition is not None or args.producer_id is not None:
            raise CliError("--transactional-id cannot be combined with --topic/--partition/--producer-id")
        return _abort_transactional_id(args, pool)
    if args.topic is None or args.partition is None:
        raise CliError("give --transactional-id ID, or --topic T --partition P [--producer-id N]")
    result = txn_admin.abort_partition_transaction(pool, args.topic, args.partition, args.producer_id)
    p = result.producer
    print(
        f"Aborted the open transaction of producer {p.producer_id} (epoch {p.producer_epoch}, "
        f"coordinator epoch {result.coordinator_epoch}) on {result.topic}-{result.partition}, "
        f"which started at offset {p.current_txn_start_offset}: wrote an ABORT marker.",
        flush=True,
    )
    return 0


def _abort_transactional_id(args: argparse.Namespace, pool: BrokerPool) -> int:
    tid = args.transactional_id
    result = txn_admin.fence_transactional_id(pool, tid, timeout_s=args.request_timeout)
    before = result.before
    fenced = (
        f"producer id {result.producer_id} is now at epoch {result.producer_epoch}; "
        f"the producer that held epoch {before.producer_epoch} is fenced."
    )
    if txn_admin.is_open(before):
        print(
            f"Aborted the {before.transaction_state} transaction of '{tid}' (producer id "
            f"{before.producer_id}, epoch {before.producer_epoch}, partitions "
            f"{txn_admin.partitions_text(before)}); {fenced}",
            flush=True,
        )
    else:
        print(
            f"'{tid}' had no open transaction (state {before.transaction_state}); {fenced}",
            flush=True,
        )
    return 0


@wire_command("exactly txn find-hanging")
def cmd_find_hanging(args: argparse.Namespace, pool: BrokerPool) -> int:
    if args.partition is not None and args.topic is None:
        raise CliError("--partition needs --topic")
    hanging = txn_admin.find_hanging(
        pool, args.max_age_ms, topic=args.topic, partition=args.partition, broker_id=args.broker_id
    )
    if args.json:
        print_json(
            {
                "hanging": [
                    {
                        "topic": h.tp.topic,
                        "partition": h.tp.partition,
                        "producer_id": h.producer.producer_id,
                        "producer_epoch": h.producer.producer_epoch,
                        "coordinator_epoch": h.producer.coordinator_epoch,
                        "start_offset": h.producer.current_txn_start_offset,
                        "last_timestamp": h.producer.last_timestamp,
                        "duration_ms": h.duration_ms,
                        "transactional_id": h.transactional_id,
                    }
                    for h in hanging
                ]
            }
        )
        return 0
    print_table(
        (
            "Topic",
            "Partition",
            "ProducerId",
            "ProducerEpoch",
            "CoordinatorEpoch",
            "StartOffset",
            "LastTimestamp",
            "DurationMs",
            "TransactionalId",
        ),
        [
            (
                h.tp.topic,
                h.tp.partition,
                h.producer.producer_id,
                h.producer.producer_epoch,
                h.producer.coordinator_epoch,
                h.producer.current_txn_start_offset,
                h.producer.last_timestamp,
                h.duration_ms,
                h.transactional_id or "None",
            )
            for h in hanging
        ],
    )
    return 0


def _producer_id(text: str) -> int:
    value = non_negative_int(text)
    if value > 2**63 - 1:
        raise argparse.ArgumentTypeError(f"too large for a producer id: {text}")
    return value


_ABORT_HELP = """\
--transactional-id ID
    Sends InitProducerId with that transactional.id, as a new instance of the
    producer would. The coordinator aborts the ongoing transaction (ABORT
    markers to all its partitions) and bumps the producer epoch, so the
    producer currently using the id is FENCED: its next send or commit fails
    with PRODUCER_FENCED and it has to be restarted.

--topic T --partition P [--producer-id N]
    For a hanging transaction (KIP-664): a partition holds an open transaction
    its coordinator no longer tracks, so the last stable offset is stuck and
    read_committed consumers stall. Finds the producer with an open transaction
    on the partition (DescribeProducers) and writes an ABORT marker for it to
    that partition (WriteTxnMarkers). The coordinator is not involved.
"""

_HANGING_HELP = """\
A transaction is hanging on a partition when a producer has an open transaction
there (DescribeProducers at the partition's leader: CurrentTransactionStartOffset
set) whose last write is older than --max-age-ms, and no coordinator will write
its marker: no transactional id has that producer id (ListTransactions at every
broker), or the id's transaction (DescribeTransactions at its coordinator) does
not include the partition. Its start offset holds the last stable offset back.
End it with: exactly txn abort --topic T --partition P --producer-id N
"""

_TXN_HELP = (
    "Transaction administration over the Kafka protocol (KIP-664): ListTransactions,\n"
    "DescribeTransactions, DescribeProducers, InitProducerId, WriteTxnMarkers.\n"
    "Output is tab-separated with a header line.\n\n" + _ABORT_HELP
)


def register(subparsers: Any) -> None:
    txn = strict(
        subparsers.add_parser(
            "txn",
            help="list, describe and abort transactions (KIP-664)",
            description=_TXN_HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    actions = txn.add_subparsers(dest="txn_action", metavar="ACTION", parser_class=StrictParser)
    actions.required = True

    list_ = actions.add_parser("list", help="list transactional ids (ListTransactions)")
    list_.add_argument(
        "--state",
        action="append",
        metavar="S",
        help="only this state (repeatable): Empty, Ongoing, PrepareCommit, PrepareAbort, "
        "CompleteCommit, CompleteAbort, PrepareEpochFence",
    )
    list_.add_argument("--producer-id", type=_producer_id, action="append", metavar="N", help="repeatable")
    list_.add_argument(
        "--duration-ms",
        type=non_negative_int,
        metavar="N",
        help="only transactions running longer than N ms (ListTransactions v1)",
    )
    add_json_option(list_)
    add_connection_options(list_)
    list_.set_defaults(func=cmd_list)

    describe = actions.add_parser(
        "describe", help="state, producer, timeout, start time and partitions (DescribeTransactions)"
    )
    describe.add_argument("transactional_ids", nargs="+", metavar="ID")
    add_json_option(describe)
    add_connection_options(describe)
    describe.set_defaults(func=cmd_describe)

    abort = actions.add_parser(
        "abort",
        help="abort a transaction: by transactional id (fences its producer) or on one partition",
        description=_ABORT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    abort.add_argument("--transactional-id", metavar="ID", help="abort this id's transaction and fence it")
    abort.add_argument("--topic", metavar="T", help="partition holding a hanging transaction")
    abort.add_argument("--partition", type=non_negative_int, metavar="P")
    abort.add_argument(
        "--producer-id",
        type=_producer_id,
        metavar="N",
        help="the producer to abort (default: the only one with an open transaction)",
    )
    add_connection_options(abort)
    abort.set_defaults(func=cmd_abort)

    hanging = actions.add_parser(
        "find-hanging",
        help="open transactions on partitions that no coordinator will end (DescribeProducers + "
        "ListTransactions + DescribeTransactions)",
        description=_HANGING_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    hanging.add_argument(
        "--max-age-ms",
        type=non_negative_int,
        default=900_000,
        metavar="N",
        help="only transactions whose producer last wrote more than N ms ago (default 900000, "
        "transaction.max.timeout.ms: no live transaction is older)",
    )
    hanging.add_argument("--topic", metavar="T", help="search this topic only (default: every topic)")
    hanging.add_argument("--partition", type=non_negative_int, metavar="P", help="with --topic")
    hanging.add_argument(
        "--broker-id", type=non_negative_int, metavar="N", help="only partitions with a replica on broker N"
    )
    add_json_option(hanging)
    add_connection_options(hanging)
    hanging.set_defaults(func=cmd_find_hanging)
