"""One module per API; the registry maps API keys to their handlers.

A handler module defines ``API_KEY`` and ``async def handle(broker, ctx, request)`` returning a
kio response object (encoded by the dispatcher), a hand-encoded body (bytes, or a list of chunks
written with ``writelines``), or None (acks=0 produce: no response). It may define
``parse_request(buf, pos, version)`` to parse the request by hand instead of with kio.

Modules are listed here by name; only the APIs whose module exists are registered (and so
advertised by ApiVersions), which lets an area land module by module.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from typing import Any

Handler = Callable[[Any, Any, Any], Awaitable[Any]]

_MODULES = (
    "produce",
    "fetch",
    "list_offsets",
    "metadata",
    "api_versions",
    "create_topics",
    "delete_topics",
    "create_partitions",
    "delete_records",
    "init_producer_id",
    "describe_configs",
    "describe_cluster",
    # groups
    "find_coordinator",
    "join_group",
    "sync_group",
    "heartbeat",
    "leave_group",
    "offset_commit",
    "offset_fetch",
    "describe_groups",
    "list_groups",
    "delete_groups",
    "txn_offset_commit",
    # transactions
    "add_partitions_to_txn",
    "add_offsets_to_txn",
    "end_txn",
    "write_txn_markers",
    "describe_producers",
    "describe_transactions",
    "list_transactions",
)

HANDLERS: dict[int, Handler] = {}
PARSERS: dict[int, Callable[[bytes | bytearray, int, int], Any]] = {}

for _name in _MODULES:
    try:
        _module = importlib.import_module(f"{__name__}.{_name}")
    except ModuleNotFoundError as _exc:
        if _exc.name == f"{__name__}.{_name}":
            continue
        raise
    HANDLERS[int(_module.API_KEY)] = _module.handle
    if hasattr(_module, "parse_request"):
        PARSERS[int(_module.API_KEY)] = _module.parse_request
