"""``exactly producers TOPIC PARTITION``: the partition's active producers (DescribeProducers,
KIP-664), as a tab-separated table with a header line, or with ``--json`` one JSON document:
``{"topic", "partition", "producers": [{"producer_id", "producer_epoch", "last_sequence",
"last_timestamp", "coordinator_epoch", "current_txn_start_offset"}]}`` (null for "None").

CurrentTransactionStartOffset is the first offset of the producer's open transaction (``None``
when it has none): the partition's last stable offset cannot pass it until the transaction ends.
"""

from __future__ import annotations

import argparse
from typing import Any

from exactly.cli.common import add_connection_options, non_negative_int, strict
from exactly.cli.output import add_json_option, print_json
from exactly.cli.txn import print_table, wire_command
from exactly.client import txn_admin
from exactly.client.broker_pool import BrokerPool


def _opt(value: int) -> str:
    return "None" if value < 0 else str(value)


@wire_command("exactly producers")
def cmd_producers(args: argparse.Namespace, pool: BrokerPool) -> int:
    producers = sorted(
        txn_admin.describe_producers(pool, args.topic, args.partition), key=lambda p: p.producer_id
    )
    if args.json:
        print_json(
            {
                "topic": args.topic,
                "partition": args.partition,
                "producers": [
                    {
                        "producer_id": p.producer_id,
                        "producer_epoch": p.producer_epoch,
                        "last_sequence": p.last_sequence,
                        "last_timestamp": p.last_timestamp,
                        "coordinator_epoch": p.coordinator_epoch if p.coordinator_epoch >= 0 else None,
                        "current_txn_start_offset": (
                            p.current_txn_start_offset if p.current_txn_start_offset >= 0 else None
                        ),
                    }
                    for p in producers
                ],
            }
        )
        return 0
    print_table(
        (
            "ProducerId",
            "ProducerEpoch",
            "LastSequence",
            "LastTimestamp",
            "CoordinatorEpoch",
            "CurrentTransactionStartOffset",
        ),
        [
            (
                p.producer_id,
                p.producer_epoch,
                p.last_sequence,
                p.last_timestamp,
                _opt(p.coordinator_epoch),
                _opt(p.current_txn_start_offset),
            )
            for p in producers
        ],
    )
    return 0


def register(subparsers: Any) -> None:
    p = strict(subparsers.add_parser("producers", help="active producers of a partition (DescribeProducers)"))
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("partition", type=non_negative_int, metavar="PARTITION")
    add_json_option(p)
    add_connection_options(p)
    p.set_defaults(func=cmd_producers)
