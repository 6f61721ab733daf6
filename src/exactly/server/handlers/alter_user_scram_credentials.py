"""AlterUserScramCredentials (51, KIP-554): add, replace or delete SCRAM credentials.

The admin client sends the salt and the salted password (PBKDF2 over the password); the broker
derives StoredKey and ServerKey and stores those (exactly.security.credentials), so no password
ever reaches the broker. Validation per user, as Kafka's ZkAdminManager: an empty name or
iterations outside 4096..16384 are UNACCEPTABLE_CREDENTIAL, an unknown mechanism
UNSUPPORTED_SASL_MECHANISM, one user/mechanism pair twice in the request DUPLICATE_RESOURCE,
deleting a credential that does not exist RESOURCE_NOT_FOUND. A user with any error has none of
its changes applied; the accepted changes of the request are written in one atomic file write.
Needs ALTER on the Cluster, else every user of the request gets CLUSTER_AUTHORIZATION_FAILED.

Cluster mode: the credentials live in ZooKeeper (``/config/users``, Kafka's layout; see
exactly.cluster.zk_scram), written from an executor thread; the other brokers learn them from
their watches."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import ApiKey, build
from exactly.security.scram import (
    MAX_ITERATIONS,
    MIN_ITERATIONS,
    ScramCredential,
    ScramMechanism,
    credential_from_salted_password,
)
from exactly.server.authz import ALTER, authorize_cluster

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.ALTER_USER_SCRAM_CREDENTIALS
log = logging.getLogger("exactly.security")


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    mod = ctx.api.response_module
    errors: dict[str, tuple[ErrorCode, str]] = {}
    order: list[str] = []
    pairs: dict[tuple[str, int], int] = {}
    for item in (*request.deletions, *request.upsertions):
        if item.name not in order:
            order.append(item.name)
        pairs[(item.name, int(item.mechanism))] = pairs.get((item.name, int(item.mechanism)), 0) + 1

    def refuse(name: str, error: ErrorCode, message: str) -> None:
        errors.setdefault(name, (error, message))

    if not authorize_cluster(broker, ctx, ALTER):  # Kafka: every user of the request gets it
        for name in order:
            refuse(name, ErrorCode.cluster_authorization_failed, "Cluster authorization failed.")
    for (name, _mech), count in pairs.items():
        if count > 1:
            refuse(
                name,
                ErrorCode.duplicate_resource,
                "A user credential cannot be altered twice in the same request",
            )
    existing = broker.credentials.users()
    deletions: list[tuple[str, ScramMechanism]] = []
    upserts: list[tuple[str, ScramMechanism, ScramCredential]] = []
    for d in request.deletions:
        mech = ScramMechanism.by_type(int(d.mechanism))
        if not d.name:
            refuse(d.name, ErrorCode.unacceptable_credential, "Username must not be empty")
        elif mech is None:
            refuse(d.name, ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism")
        elif mech not in existing.get(d.name, {}):
            refuse(
                d.name,
                ErrorCode.resource_not_found,
                "Attempt to delete a user credential that does not exist",
            )
        else:
            deletions.append((d.name, mech))
    for u in request.upsertions:
        mech = ScramMechanism.by_type(int(u.mechanism))
        if not u.name:
            refuse(u.name, ErrorCode.unacceptable_credential, "Username must not be empty")
        elif mech is None:
            refuse(u.name, ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism")
        elif not MIN_ITERATIONS <= u.iterations <= MAX_ITERATIONS:
            refuse(
                u.name,
                ErrorCode.unacceptable_credential,
                f"Iterations must be between {MIN_ITERATIONS} and {MAX_ITERATIONS}",
            )
        elif not u.salt or not u.salted_password:
            refuse(u.name, ErrorCode.unacceptable_credential, "Salt and salted password must not be empty")
        else:
            credential = credential_from_salted_password(
                mech, bytes(u.salt), bytes(u.salted_password), int(u.iterations)
            )
            upserts.append((u.name, mech, credential))
    deletions = [(n, m) for n, m in deletions if n not in errors]
    upserts = [(n, m, c) for n, m, c in upserts if n not in errors]
    if deletions or upserts:
        store = broker.credentials
        try:
            if broker.replicas is not None:  # ZooKeeper: off the event loop
                loop = asyncio.get_running_loop()
                written = await loop.run_in_executor(None, store.write, upserts, deletions)
            else:
                written = store.write(upserts, deletions)
            for user, credentials in written.items():
                store.set_user(user, credentials)
        except OSError as exc:
            log.error("cannot write the SCRAM credential store: %r", exc)
            for name in order:
                refuse(name, ErrorCode.unknown_server_error, "The credential store could not be written")
        else:
            for name, mech, _c in upserts:
                log.info("SCRAM credential %s for user %s set by %s", mech.mechanism_name, name, ctx.peer)
            for name, mech in deletions:
                log.info("SCRAM credential %s for user %s deleted by %s", mech.mechanism_name, name, ctx.peer)
    results = []
    for name in order:
        error, message = errors.get(name, (ErrorCode.none, ""))
        broker.metrics.error(API_KEY, error)
        results.append(
            build(
                mod.AlterUserScramCredentialsResult,
                user=name,
                error_code=error,
                error_message=message,  # "" on success, as Kafka writes it
            )
        )
    return build(ctx.api.response_type, results=tuple(results))
