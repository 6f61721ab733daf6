"""``exactly acls --add|--remove|--list``: manage ACLs with kafka-acls' options.

The same option names as Kafka's ``kafka-acls.sh`` (AclCommand): ``--allow-principal`` /
``--deny-principal`` (``User:name``, repeatable), ``--allow-host`` / ``--deny-host`` (default
``*``), ``--operation`` (repeatable, Kafka's names: Read, Write, Create, Delete, Alter, Describe,
ClusterAction, DescribeConfigs, AlterConfigs, IdempotentWrite, All), resources ``--topic``,
``--group``, ``--transactional-id`` (repeatable), ``--cluster``, and
``--resource-pattern-type literal|prefixed`` (``any``/``match`` as filters for --list/--remove).
The convenience options ``--producer`` (WRITE, DESCRIBE, CREATE on the topics; WRITE, DESCRIBE on
the transactional ids; ``--idempotent``: IDEMPOTENT_WRITE on the cluster) and ``--consumer``
(READ, DESCRIBE on the topics, READ on the groups) expand as in Kafka.

Everything goes through CreateAcls/DescribeAcls/DeleteAcls (exactly.client.acl_admin), so the
caller needs ALTER (add, remove) or DESCRIBE (list) on the cluster.
"""

from __future__ import annotations

import argparse
from typing import Any

from exactly.cli.common import CliError, add_connection_options, guarded, strict
from exactly.cli.security_options import security_config
from exactly.client import acl_admin
from exactly.client.wire import WireClient, WireError
from exactly.security.acl import (
    CLUSTER_NAME,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
    binding,
)

# Kafka's command-line spelling of operations (AclOperation's CamelCase names)
_OPERATIONS = {
    op.name.replace("_", "").lower(): op
    for op in AclOperation
    if op not in (AclOperation.UNKNOWN, AclOperation.ANY)
}
_PATTERNS = {
    "literal": PatternType.LITERAL,
    "prefixed": PatternType.PREFIXED,
    "any": PatternType.ANY,
    "match": PatternType.MATCH,
}


def _operation(text: str) -> AclOperation:
    op = _OPERATIONS.get(text.replace("_", "").replace("-", "").lower())
    if op is None:
        raise argparse.ArgumentTypeError(f"unknown operation {text!r}")
    return op


def _resources(args: argparse.Namespace, pattern: PatternType) -> list[ResourcePattern]:
    out = [ResourcePattern(ResourceType.TOPIC, t, pattern) for t in args.topic or ()]
    out += [ResourcePattern(ResourceType.GROUP, g, pattern) for g in args.group or ()]
    out += [ResourcePattern(ResourceType.TRANSACTIONAL_ID, x, pattern) for x in args.transactional_id or ()]
    if args.cluster:
        out.append(ResourcePattern(ResourceType.CLUSTER, CLUSTER_NAME, PatternType.LITERAL))
    return out


def _operations_for(args: argparse.Namespace, rtype: ResourceType) -> list[AclOperation]:
    ops = list(args.operation or ())
    if args.producer:
        ops += {
            ResourceType.TOPIC: [AclOperation.WRITE, AclOperation.DESCRIBE, AclOperation.CREATE],
            ResourceType.TRANSACTIONAL_ID: [AclOperation.WRITE, AclOperation.DESCRIBE],
            ResourceType.CLUSTER: [AclOperation.IDEMPOTENT_WRITE] if args.idempotent else [],
        }.get(rtype, [])
    if args.consumer:
        ops += {
            ResourceType.TOPIC: [AclOperation.READ, AclOperation.DESCRIBE],
            ResourceType.GROUP: [AclOperation.READ],
        }.get(rtype, [])
    if not ops and not (args.producer or args.consumer):
        ops = [AclOperation.ALL]  # kafka-acls' default
    return list(dict.fromkeys(ops))


def _bindings(args: argparse.Namespace) -> list[AclBinding]:
    pattern = _PATTERNS[args.resource_pattern_type or "literal"]
    if pattern not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise CliError("--add needs --resource-pattern-type literal or prefixed")
    if args.producer and args.idempotent:
        args.cluster = True
    resources = _resources(args, pattern)
    if not resources:
        raise CliError("give a resource: --topic, --group, --transactional-id or --cluster")
    principals = [(p, AclPermissionType.ALLOW, args.allow_host or ["*"]) for p in args.allow_principal or ()]
    principals += [(p, AclPermissionType.DENY, args.deny_host or ["*"]) for p in args.deny_principal or ()]
    if not principals:
        raise CliError("--add needs --allow-principal or --deny-principal")
    out = []
    for res in resources:
        for op in _operations_for(args, res.resource_type):
            for principal, permission, hosts in principals:
                for host in hosts:
                    out.append(
                        binding(
                            res.resource_type, res.name, res.pattern_type, principal, host, op, permission
                        )
                    )
    return out


def _filters(args: argparse.Namespace) -> list[AclBindingFilter]:
    pattern = _PATTERNS[args.resource_pattern_type or ("any" if args.list else "literal")]
    resources = _resources(args, pattern)
    principals = [*(args.allow_principal or ()), *(args.deny_principal or ()), *(args.principal or ())]
    ops = args.operation or [AclOperation.ANY]
    if args.list and not resources:
        resources = [ResourcePattern(ResourceType.ANY, "", pattern)]
    if not resources:
        raise CliError("--remove needs a resource: --topic, --group, --transactional-id or --cluster")
    out = []
    for res in resources:
        for op in ops:
            for principal in principals or [None]:
                out.append(
                    AclBindingFilter(
                        res.resource_type,
                        res.name if res.resource_type != ResourceType.ANY else None,
                        res.pattern_type,
                        principal,
                        None,
                        op,
                        AclPermissionType.ANY,
                    )
                )
    return out


def _print(bindings: list[AclBinding]) -> None:
    print("ResourceType\tName\tPatternType\tPrincipal\tHost\tOperation\tPermission")
    for b in bindings:
        p, e = b.pattern, b.entry
        print(
            f"{p.resource_type.name}\t{p.name}\t{p.pattern_type.name}\t{e.principal}\t{e.host}\t"
            f"{e.operation.name}\t{e.permission.name}",
            flush=True,
        )


@guarded("exactly acls")
def cmd_acls(args: argparse.Namespace) -> int:
    if sum((args.add, args.remove, args.list)) != 1:
        raise CliError("give exactly one of --add, --remove, --list")
    try:
        with WireClient.connect(
            args.bootstrap_server, timeout=args.request_timeout, config=security_config(args)
        ) as client:
            if args.add:
                bindings = _bindings(args)
                acl_admin.create_acls(client, bindings)
                print(f"Added {len(bindings)} ACL(s):")
                _print(bindings)
            elif args.remove:
                removed = acl_admin.delete_acls(client, _filters(args))
                print(f"Removed {len(removed)} ACL(s):")
                _print(removed)
            else:
                found: list[AclBinding] = []
                for f in _filters(args):
                    found += [b for b in acl_admin.describe_acls(client, f) if b not in found]
                _print(found)
    except WireError as exc:
        raise CliError(str(exc)) from None
    return 0


def register(subparsers: Any) -> None:
    p = strict(
        subparsers.add_parser(
            "acls",
            help="add, remove and list ACLs (kafka-acls options; CreateAcls/DescribeAcls/DeleteAcls)",
            description=__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    p.add_argument("--add", action="store_true", help="add the ACLs described by the other options")
    p.add_argument("--remove", action="store_true", help="remove the matching ACLs")
    p.add_argument("--list", action="store_true", help="list the matching ACLs (all without a resource)")
    p.add_argument("--allow-principal", action="append", metavar="User:NAME")
    p.add_argument("--deny-principal", action="append", metavar="User:NAME")
    p.add_argument(
        "--principal", action="append", metavar="User:NAME", help="--list/--remove: only this principal"
    )
    p.add_argument("--allow-host", action="append", metavar="IP")
    p.add_argument("--deny-host", action="append", metavar="IP")
    p.add_argument("--operation", action="append", type=_operation, metavar="OP")
    p.add_argument("--topic", action="append", metavar="T")
    p.add_argument("--group", action="append", metavar="G")
    p.add_argument("--transactional-id", action="append", metavar="ID")
    p.add_argument("--cluster", action="store_true", help="the cluster resource (kafka-cluster)")
    p.add_argument("--resource-pattern-type", choices=sorted(_PATTERNS), help="default literal (--list: any)")
    p.add_argument("--producer", action="store_true", help="the ACLs a producer needs")
    p.add_argument(
        "--idempotent", action="store_true", help="with --producer: IDEMPOTENT_WRITE on the cluster"
    )
    p.add_argument("--consumer", action="store_true", help="the ACLs a consumer needs")
    add_connection_options(p)
    p.set_defaults(func=cmd_acls)
