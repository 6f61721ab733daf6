"""ACLs in ZooKeeper under Kafka's layout (ZooKeeper mode's AclAuthorizer), shared by every broker.

* LITERAL bindings of a resource live in ``/kafka-acl/<Type>/<name>``, PREFIXED ones in
  ``/kafka-acl-extended/prefixed/<Type>/<name>`` (``<Type>``: Topic, Group, Cluster,
  TransactionalId), as ``{"version": 1, "acls": [{"principal", "permissionType", "operation",
  "host"}]}`` with Kafka's names (``Allow``, ``Read``, ``IdempotentWrite``...), so a Kafka
  cluster's ACL znodes read the same.
* A change rewrites one resource's znode with a conditional set at the version just read (retried
  on a concurrent change: two brokers adding ACLs to one topic never lose one), deletes it when it
  becomes empty, then creates a sequential change notification: ``/kafka-acl-changes/
  acl_changes_<seq>`` holding ``Type:name`` for a literal resource, ``/kafka-acl-extended-changes/
  acl_changes_<seq>`` holding ``{"version":1,"resourceType","name","patternType"}`` for a
  prefixed one.
* Every broker watches both notification paths and reloads the whole ACL set on any change
  (Kafka reloads only the changed resource; ACL sets are small, and a full reload cannot miss a
  merged watch event). Notifications are not cleaned up here (Kafka expires them after 15 min).

Threading: the calls block (kazoo); the broker makes them from an executor thread, and the watch
callback runs on kazoo's thread. ``Authorizer.replace`` swaps its index atomically, so a request
on the event loop sees the old or the new set.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from exactly.cluster.zk_base import ensure_path
from exactly.security.acl import (
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from exactly.security.authorizer import Authorizer

log = logging.getLogger(__name__)

LITERAL_ROOT = "/kafka-acl"
PREFIXED_ROOT = "/kafka-acl-extended/prefixed"
LITERAL_CHANGES = "/kafka-acl-changes"
EXTENDED_CHANGES = "/kafka-acl-extended-changes"
CHANGE_PREFIX = "acl_changes_"

_TYPE_NAMES = {
    ResourceType.TOPIC: "Topic",
    ResourceType.GROUP: "Group",
    ResourceType.CLUSTER: "Cluster",
    ResourceType.TRANSACTIONAL_ID: "TransactionalId",
}
_TYPES = {v: k for k, v in _TYPE_NAMES.items()}
_OP_NAMES = {op: "".join(w.capitalize() for w in op.name.split("_")) for op in AclOperation}
_OPS = {v: k for k, v in _OP_NAMES.items()}
_PERM_NAMES = {AclPermissionType.ALLOW: "Allow", AclPermissionType.DENY: "Deny"}
_PERMS = {v: k for k, v in _PERM_NAMES.items()}
_ROOTS = {PatternType.LITERAL: LITERAL_ROOT, PatternType.PREFIXED: PREFIXED_ROOT}


def resource_path(p: ResourcePattern) -> str:
    return f"{_ROOTS[p.pattern_type]}/{_TYPE_NAMES[p.resource_type]}/{p.name}"


def encode_entries(entries: Iterable[AccessControlEntry]) -> bytes:
    acls = [
        {
            "principal": e.principal,
            "permissionType": _PERM_NAMES[e.permission],
            "operation": _OP_NAMES[e.operation],
            "host": e.host,
        }
        for e in sorted(entries, key=lambda e: (e.principal, e.host, e.operation, e.permission))
    ]
    return json.dumps({"version": 1, "acls": acls}).encode()


def decode_entries(data: bytes) -> set[AccessControlEntry]:
    if not data:
        return set()
    obj = json.loads(data)
    return {
        AccessControlEntry(
            str(a["principal"]), str(a["host"]), _OPS[a["operation"]], _PERMS[a["permissionType"]]
        )
        for a in obj.get("acls", [])
    }


class ZkAclStore:
    """The cluster's ACLs in ZooKeeper, mirrored into this broker's authorizer (same interface as
    the single broker's ``exactly.security.acl_store.AclStore``)."""

    def __init__(self, client: Any, authorizer: Authorizer) -> None:
        self.client = client
        self.authorizer = authorizer
        self._reload_lock = threading.Lock()  # a read of ZooKeeper and its replace, together

    # ---- reading ------------------------------------------------------------------------------
    def load_all(self) -> list[AclBinding]:
        found: list[AclBinding] = []
        for pattern_type, root in _ROOTS.items():
            try:
                type_names = self.client.get_children(root)
            except NoNodeError:
                continue
            for type_name in type_names:
                rtype = _TYPES.get(type_name)
                if rtype is None:
                    continue  # DelegationToken, User: not authorized here
                try:
                    names = self.client.get_children(f"{root}/{type_name}")
                except NoNodeError:
                    continue
                for name in names:
                    pattern = ResourcePattern(rtype, name, pattern_type)
                    try:
                        data, _stat = self.client.get(resource_path(pattern))
                    except NoNodeError:
                        continue
                    try:
                        entries = decode_entries(data)
                    except (ValueError, KeyError) as exc:
                        log.error("ignoring unreadable ACL znode %s: %s", resource_path(pattern), exc)
                        continue
                    found.extend(AclBinding(pattern, e) for e in entries)
        return found

    def reload(self) -> None:
        with self._reload_lock:
            self.authorizer.replace(self.load_all())

    def watch(self) -> None:
        """Reload now and on every change notification (kazoo thread)."""
        for path in (LITERAL_CHANGES, EXTENDED_CHANGES):
            ensure_path(self.client, path)

            def on_change(_children: list[str]) -> None:
                try:
                    self.reload()
                except Exception:  # a watch callback must not die: the next change retries
                    log.exception("could not reload the ACLs from ZooKeeper")

            self.client.ChildrenWatch(path, on_change)

    def describe(self, flt: AclBindingFilter) -> list[AclBinding]:
        return sorted(self.authorizer.matching(flt), key=_order)

    # ---- writing ------------------------------------------------------------------------------
    def _update(
        self, pattern: ResourcePattern, change: Callable[[set[AccessControlEntry]], set[AccessControlEntry]]
    ) -> bool:
        """Apply ``change`` to one resource's entries with compare-and-set; True if it changed."""
        path = resource_path(pattern)
        while True:
            try:
                data, stat = self.client.get(path)
                current, version = decode_entries(data), stat.version
            except NoNodeError:
                current, version = set(), None
            new = change(set(current))
            if new == current:
                return False
            try:
                if version is None:
                    self.client.create(path, encode_entries(new), makepath=True)
                elif new:
                    self.client.set(path, encode_entries(new), version=version)
                else:
                    self.client.delete(path, version=version)
            except (BadVersionError, NodeExistsError, NoNodeError):
                continue  # another broker changed it: read again
            self._notify(pattern)
            return True

    def _notify(self, pattern: ResourcePattern) -> None:
        if pattern.pattern_type == PatternType.LITERAL:
            path, data = LITERAL_CHANGES, f"{_TYPE_NAMES[pattern.resource_type]}:{pattern.name}".encode()
        else:
            path = EXTENDED_CHANGES
            data = json.dumps(
                {
                    "version": 1,
                    "resourceType": _TYPE_NAMES[pattern.resource_type],
                    "name": pattern.name,
                    "patternType": pattern.pattern_type.name,
                }
            ).encode()
        self.client.create(f"{path}/{CHANGE_PREFIX}", data, sequence=True, makepath=True)

    def add(self, bindings: Iterable[AclBinding]) -> None:
        by_pattern: dict[ResourcePattern, set[AccessControlEntry]] = {}
        for b in bindings:
            by_pattern.setdefault(b.pattern, set()).add(b.entry)
        for pattern, entries in by_pattern.items():
            self._update(pattern, lambda current, entries=entries: current | entries)  # type: ignore[misc]
        self.reload()  # read-your-writes on this broker without waiting for the watch

    def remove(self, filters: list[AclBindingFilter]) -> list[list[AclBinding]]:
        everything = self.load_all()
        per_filter = [sorted((b for b in everything if f.matches(b)), key=_order) for f in filters]
        gone: dict[ResourcePattern, set[AccessControlEntry]] = {}
        for found in per_filter:
            for b in found:
                gone.setdefault(b.pattern, set()).add(b.entry)
        for pattern, entries in gone.items():
            self._update(pattern, lambda current, entries=entries: current - entries)  # type: ignore[misc]
        self.reload()
        return per_filter


def _order(b: AclBinding) -> tuple[int, str, int, str, str, int, int]:
    p, e = b.pattern, b.entry
    return (p.resource_type, p.name, p.pattern_type, e.principal, e.host, e.operation, e.permission)
