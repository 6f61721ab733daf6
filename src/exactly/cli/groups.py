"""``exactly groups list|describe GROUP``: consumer groups (confluent-kafka's AdminClient).

list
    ``GROUP<TAB>STATE`` per group, with a header line.
describe GROUP
    A summary line (state, assignor, coordinator, member count), then Kafka's
    ``kafka-consumer-groups.sh --describe`` table: one row per partition the group has a committed
    offset for or a member is assigned, with CURRENT-OFFSET (committed), LOG-END-OFFSET (the high
    watermark), LAG and the owning member (``-`` when none); members with no partitions get a
    row of their own.

``--json`` prints one JSON document instead: ``{"groups": [{"group_id", "state"}]}`` for list;
for describe ``{"group_id", "state", "assignor", "coordinator", "members": [{"member_id",
"client_id", "host", "partitions": [{"topic", "partition"}]}], "offsets": [{"topic",
"partition", "committed_offset", "log_end_offset", "lag", "member_id"}]}`` (null where the table
shows ``-``).

Every failure is one line on stderr, ``exactly groups <action>: error: ...``, exit code 1.
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
    guarded,
    kafka_error_of,
    strict,
)
from exactly.cli.output import add_json_option, print_json
from exactly.cli.txn import print_table

_TRANSPORT = ("_TRANSPORT", "_TIMED_OUT", "_ALL_BROKERS_DOWN")


def _result(future: Any, what: str, args: argparse.Namespace, errors: ErrorLog) -> Any:
    try:
        return future.result(timeout=args.request_timeout + 5)
    except Exception as exc:
        err = kafka_error_of(exc)
        if err is None:
            if isinstance(exc, TimeoutError):
                raise CliError(f"{what}: timed out ({errors.hint(args.bootstrap_server)})") from None
            raise
        if err.name() in _TRANSPORT:
            raise CliError(f"{what} failed ({errors.hint(args.bootstrap_server)})") from None
        if err.name() == "GROUP_ID_NOT_FOUND":
            raise CliError(f"consumer group '{args.group}' does not exist") from None
        raise CliError(f"{what} failed: {err.name()}: {err.str()}") from None


def _state_name(state: Any) -> str:
    name = getattr(state, "name", str(state))
    return {
        "PREPARING_REBALANCING": "PreparingRebalance",
        "COMPLETING_REBALANCING": "CompletingRebalance",
    }.get(name, name.title().replace("_", ""))


@guarded("exactly groups list")
def cmd_list(args: argparse.Namespace) -> int:
    errors = ErrorLog()
    admin = admin_client(args, errors)
    result = _result(
        admin.list_consumer_groups(request_timeout=args.request_timeout), "ListGroups", args, errors
    )
    if result.errors and not result.valid:
        err = kafka_error_of(result.errors[0]) or result.errors[0]
        name = err.name() if hasattr(err, "name") else str(err)
        if name in _TRANSPORT:
            raise CliError(f"ListGroups failed ({errors.hint(args.bootstrap_server)})")
        raise CliError(f"ListGroups failed: {name}")
    rows = sorted((g.group_id, _state_name(g.state)) for g in result.valid)
    if args.json:
        print_json({"groups": [{"group_id": group, "state": state} for group, state in rows]})
        return 0
    print_table(("GROUP", "STATE"), rows)
    return 0


@guarded("exactly groups describe")
def cmd_describe(args: argparse.Namespace) -> int:
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import OffsetSpec as _OffsetSpec  # type: ignore[attr-defined]

    offset_spec: Any = _OffsetSpec

    errors = ErrorLog()
    admin = admin_client(args, errors)
    group = args.group
    futures = admin.describe_consumer_groups([group], request_timeout=args.request_timeout)
    desc = _result(futures[group], "DescribeGroups", args, errors)
    futures = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group)], request_timeout=args.request_timeout
    )
    offsets = _result(futures[group], "OffsetFetch", args, errors)
    committed = {
        (tp.topic, tp.partition): tp.offset for tp in (offsets.topic_partitions or []) if tp.error is None
    }
    state = _state_name(desc.state)
    if state == "Dead" and not desc.members and not committed:
        raise CliError(f"consumer group '{group}' does not exist")

    owner: dict[tuple[str, int], Any] = {}
    idle_members = []
    for member in desc.members:
        tps = member.assignment.topic_partitions if member.assignment else []
        if not tps:
            idle_members.append(member)
        for tp in tps:
            owner[(tp.topic, tp.partition)] = member

    keys = sorted(set(committed) | set(owner))
    ends: dict[tuple[str, int], int] = {}
    if keys:
        futures = admin.list_offsets(
            {TopicPartition(t, p): offset_spec.latest() for t, p in keys},
            request_timeout=args.request_timeout,
        )
        for tp, fut in futures.items():
            try:
                ends[(tp.topic, tp.partition)] = fut.result(timeout=args.request_timeout + 5).offset
            except Exception as exc:  # a deleted topic: no log end offset, keep the row
                if kafka_error_of(exc) is None and not isinstance(exc, TimeoutError):
                    raise

    coordinator = desc.coordinator.id if desc.coordinator is not None else None
    offsets_doc: list[dict[str, Any]] = []
    for key in keys:
        current = committed.get(key)
        end = ends.get(key)
        current = current if current is not None and current >= 0 else None
        end = end if end is not None and end >= 0 else None
        m = owner.get(key)
        offsets_doc.append(
            {
                "topic": key[0],
                "partition": key[1],
                "committed_offset": current,
                "log_end_offset": end,
                "lag": max(end - current, 0) if current is not None and end is not None else None,
                "member_id": m.member_id if m is not None else None,
            }
        )
    if args.json:
        print_json(
            {
                "group_id": group,
                "state": state,
                "assignor": desc.partition_assignor or None,
                "coordinator": coordinator,
                "members": [
                    {
                        "member_id": m.member_id,
                        "client_id": m.client_id,
                        "host": m.host,
                        "partitions": [
                            {"topic": tp.topic, "partition": tp.partition}
                            for tp in (m.assignment.topic_partitions if m.assignment else [])
                        ],
                    }
                    for m in sorted(desc.members, key=lambda m: m.member_id)
                ],
                "offsets": offsets_doc,
            }
        )
        return 0
    print(
        f"Group: {group}\tState: {state}\tAssignor: {desc.partition_assignor or '-'}\t"
        f"Coordinator: {_dash(coordinator, 'None')}\tMembers: {len(desc.members)}",
        flush=True,
    )
    rows: list[tuple[Any, ...]] = []
    for entry in offsets_doc:
        m = owner.get((entry["topic"], entry["partition"]))
        who = (m.member_id, m.host, m.client_id) if m is not None else ("-", "-", "-")
        rows.append(
            (
                group,
                entry["topic"],
                entry["partition"],
                _dash(entry["committed_offset"]),
                _dash(entry["log_end_offset"]),
                _dash(entry["lag"]),
                *who,
            )
        )
    for m in idle_members:
        rows.append((group, "-", "-", "-", "-", "-", m.member_id, m.host, m.client_id))
    print_table(
        (
            "GROUP",
            "TOPIC",
            "PARTITION",
            "CURRENT-OFFSET",
            "LOG-END-OFFSET",
            "LAG",
            "CONSUMER-ID",
            "HOST",
            "CLIENT-ID",
        ),
        rows,
    )
    return 0


def _dash(value: Any, absent: str = "-") -> str:
    return absent if value is None else str(value)


def register(subparsers: Any) -> None:
    groups = strict(subparsers.add_parser("groups", help="list and describe consumer groups"))
    actions = groups.add_subparsers(dest="groups_action", metavar="ACTION", parser_class=StrictParser)
    actions.required = True

    list_ = actions.add_parser("list", help="consumer groups and their states")
    add_json_option(list_)
    add_connection_options(list_)
    list_.set_defaults(func=cmd_list)

    describe = actions.add_parser(
        "describe", help="members, assignments, committed offsets and lag of a group"
    )
    describe.add_argument("group", metavar="GROUP")
    add_json_option(describe)
    add_connection_options(describe)
    describe.set_defaults(func=cmd_describe)
