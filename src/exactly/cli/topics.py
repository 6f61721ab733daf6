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

The helpers every command shares (strict parsing, error reporting, client configuration) are in
``common.py``.
"""

from __future__ import annotations

import argparse
from typing import Any

from exactly.cli.common import (
    CliError,
    ErrorLog,
    StrictParser,
    add_connection_options,
    admin_client,
    fetch_metadata,
    guarded,
    kafka_error_of,
    key_value,
    non_negative_int,
    positive_int,
    strict,
    topic_error,
    wait_future,
)
from exactly.cli.output import add_json_option, print_json
from exactly.cli.security_options import security_config
from exactly.client.dirty_ratios import read_dirty_ratios


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
