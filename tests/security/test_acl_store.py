"""The ACL store: changes persist (a new store on the same file sees them) and reach the
authorizer at once; removal reports what each filter matched."""

from __future__ import annotations

from pathlib import Path

from exactly.security.acl import (
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    binding,
)
from exactly.security.acl_store import AclStore
from exactly.security.authorizer import Authorizer, AuthorizerConfig


def _authorizer() -> Authorizer:
    return Authorizer(AuthorizerConfig(frozenset(), False))


def test_add_persists_and_applies(tmp_path: Path) -> None:
    path = tmp_path / "acls.json"
    a = _authorizer()
    store = AclStore(path, a)
    w = binding(
        ResourceType.TOPIC,
        "t",
        PatternType.LITERAL,
        "User:x",
        "*",
        AclOperation.WRITE,
        AclPermissionType.ALLOW,
    )
    assert not a.authorize("User:x", "h", AclOperation.WRITE, ResourceType.TOPIC, "t")
    store.add([w])
    assert a.authorize("User:x", "h", AclOperation.WRITE, ResourceType.TOPIC, "t")
    assert not list(tmp_path.glob("*.tmp"))

    b = _authorizer()
    reopened = AclStore(path, b)
    assert b.authorize("User:x", "h", AclOperation.WRITE, ResourceType.TOPIC, "t")
    everything = AclBindingFilter(
        ResourceType.ANY, None, PatternType.ANY, None, None, AclOperation.ANY, AclPermissionType.ANY
    )
    assert reopened.describe(everything) == [w]
    assert reopened.remove([everything, everything]) == [[w], [w]]
    assert not b.authorize("User:x", "h", AclOperation.WRITE, ResourceType.TOPIC, "t")
    assert AclStore(path, _authorizer()).describe(everything) == []
