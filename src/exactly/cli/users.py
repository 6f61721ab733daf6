"""``exactly users add|delete|list``: SCRAM credentials, through Kafka's admin API
(AlterUserScramCredentials / DescribeUserScramCredentials via confluent-kafka's AdminClient), so
it works against any broker that speaks it; the counterpart of ``kafka-configs --entity-type
users --alter --add-config 'SCRAM-SHA-512=[password=...]'``.

add NAME
    Set the password for each ``--mechanism`` (default SCRAM-SHA-256 and SCRAM-SHA-512) with
    ``--iterations`` (default 4096). The password comes from ``--password-stdin`` (first line of
    standard input) or ``--password``. The client salts and hashes it; the broker stores only
    the salted keys.
delete NAME
    Remove the user's credential for each ``--mechanism`` (default: every one it has).
list
    ``USER<TAB>MECHANISM<TAB>ITERATIONS`` per credential, with a header line.

``--command-config FILE`` (Kafka's tools' properties file; ``sasl.jaas.config`` and a PEM
truststore are understood) and ``-X KEY=VALUE`` (librdkafka's names: ``security.protocol``,
``sasl.mechanism``, ``sasl.username``, ``ssl.ca.location``, ...) reach a secured listener, as for
every command (:mod:`exactly.cli.security_options`). Every failure is one stderr line, exit code 1.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from exactly.cli.common import (
    CliError,
    ErrorLog,
    add_connection_options,
    client_config,
    guarded,
    kafka_error_of,
    strict,
)
from exactly.cli.txn import print_table

MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


def _admin(args: argparse.Namespace, errors: ErrorLog) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient(client_config(args, errors, **{"allow.auto.create.topics": False}))


def _mechanism(name: str) -> Any:
    from confluent_kafka.admin import ScramMechanism  # type: ignore[attr-defined]

    return ScramMechanism[name.replace("-", "_")]


def _wait(futures: dict[str, Any], what: str, args: argparse.Namespace, errors: ErrorLog) -> None:
    failures = []
    for user, future in futures.items():
        try:
            future.result(timeout=args.request_timeout + 5)
        except Exception as exc:
            err = kafka_error_of(exc)
            if err is None:
                if isinstance(exc, TimeoutError):
                    raise CliError(f"{what}: timed out ({errors.hint(args.bootstrap_server)})") from None
                raise
            failures.append(f"{user}: {err.name()}: {err.str()}")
    if failures:
        raise CliError(f"{what} failed: " + "; ".join(failures))


@guarded("exactly users add")
def cmd_add(args: argparse.Namespace) -> int:
    from confluent_kafka.admin import ScramCredentialInfo, UserScramCredentialUpsertion  # type: ignore[attr-defined]

    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    elif args.password is not None:
        password = args.password
    else:
        raise CliError("give the password with --password-stdin or --password")
    if not password:
        raise CliError("the password must not be empty")
    errors = ErrorLog()
    admin = _admin(args, errors)
    upserts = [
        UserScramCredentialUpsertion(
            args.name, ScramCredentialInfo(_mechanism(m), args.iterations), password.encode()
        )
        for m in args.mechanism or MECHANISMS
    ]
    futures = admin.alter_user_scram_credentials(upserts, request_timeout=args.request_timeout)
    _wait(futures, "AlterUserScramCredentials", args, errors)
    print(f"user {args.name}: {', '.join(args.mechanism or MECHANISMS)} set")
    return 0


def _describe(
    admin: Any, args: argparse.Namespace, errors: ErrorLog, users: list[str] | None
) -> dict[str, Any]:
    try:
        if users is None:
            return dict(
                admin.describe_user_scram_credentials(request_timeout=args.request_timeout).result(
                    timeout=args.request_timeout + 5
                )
            )
        futures = admin.describe_user_scram_credentials(users, request_timeout=args.request_timeout)
        return {u: f.result(timeout=args.request_timeout + 5) for u, f in futures.items()}
    except Exception as exc:
        err = kafka_error_of(exc)
        if err is None:
            if isinstance(exc, TimeoutError):
                raise CliError(
                    f"DescribeUserScramCredentials: timed out ({errors.hint(args.bootstrap_server)})"
                ) from None
            raise
        if err.name() == "RESOURCE_NOT_FOUND":
            raise CliError(f"user '{users[0] if users else ''}' has no SCRAM credentials") from None
        raise CliError(f"DescribeUserScramCredentials failed: {err.name()}: {err.str()}") from None


@guarded("exactly users delete")
def cmd_delete(args: argparse.Namespace) -> int:
    from confluent_kafka.admin import UserScramCredentialDeletion  # type: ignore[attr-defined]

    errors = ErrorLog()
    admin = _admin(args, errors)
    mechanisms = args.mechanism
    if not mechanisms:
        description = _describe(admin, args, errors, [args.name])[args.name]
        mechanisms = [info.mechanism.name.replace("_", "-") for info in description.scram_credential_infos]
    deletions = [UserScramCredentialDeletion(args.name, _mechanism(m)) for m in mechanisms]
    futures = admin.alter_user_scram_credentials(deletions, request_timeout=args.request_timeout)
    _wait(futures, "AlterUserScramCredentials", args, errors)
    print(f"user {args.name}: {', '.join(mechanisms)} deleted")
    return 0


@guarded("exactly users list")
def cmd_list(args: argparse.Namespace) -> int:
    errors = ErrorLog()
    admin = _admin(args, errors)
    rows = []
    for user, description in sorted(_describe(admin, args, errors, None).items()):
        for info in description.scram_credential_infos:
            rows.append((user, info.mechanism.name.replace("_", "-"), str(info.iterations)))
    print_table(("USER", "MECHANISM", "ITERATIONS"), rows)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = strict(sub.add_parser("users", help="SCRAM users (add / delete / list)"))
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True

    def common(q: argparse.ArgumentParser) -> None:
        add_connection_options(q)  # --command-config / -X included

    add = strict(actions.add_parser("add", help="create a user or change its password"))
    add.add_argument("name")
    add.add_argument("--mechanism", action="append", choices=MECHANISMS, help="default: both")
    add.add_argument("--iterations", type=int, default=4096, help="PBKDF2 iterations (4096..16384)")
    add.add_argument("--password", default=None, help="the password (visible to ps: prefer --password-stdin)")
    add.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    common(add)
    add.set_defaults(func=cmd_add)
    delete = strict(actions.add_parser("delete", help="remove a user's SCRAM credentials"))
    delete.add_argument("name")
    delete.add_argument("--mechanism", action="append", choices=MECHANISMS, help="default: all it has")
    common(delete)
    delete.set_defaults(func=cmd_delete)
    lst = strict(actions.add_parser("list", help="list users and their mechanisms"))
    common(lst)
    lst.set_defaults(func=cmd_list)
