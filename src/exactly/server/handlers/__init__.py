"""One module per API; the registry maps API keys to their handlers.

A handler module defines ``API_KEY`` and ``async def handle(broker, ctx, request)`` returning a
kio response object (encoded by the dispatcher), a hand-encoded body (bytes, or a list of chunks
written with ``writelines``), or None (acks=0 produce: no response). It may define
``parse_request(buf, pos, version)`` to parse the request by hand instead of with kio.

Every module is imported by name below: a renamed or missing handler fails the broker's start-up
with an ImportError instead of silently vanishing from ApiVersions, and the registry must cover
exactly the APIs of the version table (exactly.protocol.apis.VERSION_RANGES), which is what
ApiVersions advertises and the dispatcher accepts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any

from exactly.protocol.apis import VERSION_RANGES
from exactly.server.handlers import (
    add_offsets_to_txn,
    add_partitions_to_txn,
    alter_user_scram_credentials,
    api_versions,
    create_acls,
    create_partitions,
    create_topics,
    delete_acls,
    delete_groups,
    delete_records,
    delete_topics,
    describe_acls,
    describe_cluster,
    describe_configs,
    describe_groups,
    describe_producers,
    describe_transactions,
    describe_user_scram_credentials,
    end_txn,
    fetch,
    find_coordinator,
    heartbeat,
    init_producer_id,
    join_group,
    leave_group,
    list_groups,
    list_offsets,
    list_transactions,
    metadata,
    offset_commit,
    offset_fetch,
    offset_for_leader_epoch,
    produce,
    sasl_authenticate,
    sasl_handshake,
    sync_group,
    txn_offset_commit,
    write_txn_markers,
)

Handler = Callable[[Any, Any, Any], Awaitable[Any]]

_MODULES: tuple[ModuleType, ...] = (
    produce,
    fetch,
    list_offsets,
    metadata,
    api_versions,
    create_topics,
    delete_topics,
    create_partitions,
    delete_records,
    init_producer_id,
    offset_for_leader_epoch,
    describe_configs,
    describe_cluster,
    # groups
    find_coordinator,
    join_group,
    sync_group,
    heartbeat,
    leave_group,
    offset_commit,
    offset_fetch,
    describe_groups,
    list_groups,
    delete_groups,
    txn_offset_commit,
    # transactions
    add_partitions_to_txn,
    add_offsets_to_txn,
    end_txn,
    write_txn_markers,
    describe_producers,
    describe_transactions,
    list_transactions,
    # security
    create_acls,
    describe_acls,
    delete_acls,
    sasl_handshake,
    sasl_authenticate,
    describe_user_scram_credentials,
    alter_user_scram_credentials,
)

HANDLERS: dict[int, Handler] = {int(m.API_KEY): m.handle for m in _MODULES}
PARSERS: dict[int, Callable[[bytes | bytearray, int, int], Any]] = {
    int(m.API_KEY): m.parse_request for m in _MODULES if hasattr(m, "parse_request")
}

if HANDLERS.keys() != {int(k) for k in VERSION_RANGES}:
    raise ImportError(
        "handler registry and VERSION_RANGES disagree: "
        f"no handler for {sorted(set(map(int, VERSION_RANGES)) - HANDLERS.keys())}, "
        f"no versions for {sorted(HANDLERS.keys() - set(map(int, VERSION_RANGES)))}"
    )
