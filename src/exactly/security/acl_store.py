"""The durable ACL set of a broker: ``<data-dir>/acls.json``, rewritten atomically on each change.

Why a file in the data directory: ACLs must survive a restart and a crash in the middle of a
CreateAcls must leave the old or the new set, never a torn one (``write_durably``: temp file,
fsync, rename, directory fsync). Order of a change: compute the new set -> persist it -> hand it
to the authorizer; a failed write leaves both the file and the authorizer on the old set.

Format: ``{"version": 1, "acls": [binding, ...]}`` with Kafka's wire codes (``AclBinding.to_json``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from exactly.security.acl import AclBinding, AclBindingFilter
from exactly.security.authorizer import Authorizer
from exactly.storage.durable import write_durably

ACL_FILE = "acls.json"


class AclStoreLike(Protocol):
    """What the ACL APIs need from a store: this file store (single broker) or ZooKeeper's
    (``exactly.cluster.zk_acls``). ``add``/``remove`` may block (fsync, ZooKeeper): callers on the
    event loop run them in an executor."""

    def add(self, bindings: Iterable[AclBinding]) -> None: ...

    def remove(self, filters: list[AclBindingFilter]) -> list[list[AclBinding]]: ...

    def describe(self, flt: AclBindingFilter) -> list[AclBinding]: ...


def load_bindings(path: Path) -> list[AclBinding]:
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    return [AclBinding.from_json(obj) for obj in data.get("acls", [])]


class AclStore:
    """Owns the persisted binding set and keeps the authorizer's copy equal to it."""

    def __init__(self, path: Path, authorizer: Authorizer) -> None:
        self.path = path
        self.authorizer = authorizer
        self._bindings: set[AclBinding] = set(load_bindings(path))
        self._lock = threading.Lock()  # changes run in executor threads: one at a time
        authorizer.replace(self._bindings)

    def _commit(self, new: set[AclBinding]) -> None:
        body = {"version": 1, "acls": [b.to_json() for b in sorted(new, key=_order)]}
        write_durably(self.path, json.dumps(body, indent=1).encode())
        self._bindings = new
        self.authorizer.replace(new)

    def add(self, bindings: Iterable[AclBinding]) -> None:
        with self._lock:
            new = self._bindings | set(bindings)
            if new != self._bindings:
                self._commit(new)

    def remove(self, filters: list[AclBindingFilter]) -> list[list[AclBinding]]:
        """Delete what each filter matches; returns the deleted bindings per filter (a binding
        matched by two filters is reported under both, as Kafka does)."""
        with self._lock:
            per_filter = [[b for b in sorted(self._bindings, key=_order) if f.matches(b)] for f in filters]
            gone = {b for found in per_filter for b in found}
            if gone:
                self._commit(self._bindings - gone)
            return per_filter

    def describe(self, flt: AclBindingFilter) -> list[AclBinding]:
        return [b for b in sorted(self._bindings, key=_order) if flt.matches(b)]


def _order(b: AclBinding) -> tuple[int, str, int, str, str, int, int]:
    p, e = b.pattern, b.entry
    return (p.resource_type, p.name, p.pattern_type, e.principal, e.host, e.operation, e.permission)
