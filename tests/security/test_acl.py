"""ACL bindings and filters: validation of what CreateAcls may store, and Kafka's filter semantics
(ResourcePatternFilter: ANY vs MATCH pattern types, null fields match all)."""

from __future__ import annotations

from exactly.security.acl import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    binding,
    binding_error,
)

ALLOW = AclPermissionType.ALLOW


def b(
    name: str, pattern: PatternType = PatternType.LITERAL, rtype: ResourceType = ResourceType.TOPIC
) -> AclBinding:
    return binding(rtype, name, pattern, "User:alice", "*", AclOperation.READ, ALLOW)


def flt(name: str | None, pattern: PatternType, rtype: ResourceType = ResourceType.ANY) -> AclBindingFilter:
    return AclBindingFilter(rtype, name, pattern, None, None, AclOperation.ANY, AclPermissionType.ANY)


def test_binding_validation() -> None:
    assert binding_error(b("t")) is None
    assert binding_error(b("kafka-cluster", rtype=ResourceType.CLUSTER)) is None
    assert binding_error(b("other", rtype=ResourceType.CLUSTER)) is not None
    assert binding_error(b("")) is not None
    assert binding_error(b("t", PatternType.MATCH)) is not None
    assert binding_error(b("t", rtype=ResourceType.USER)) is not None
    bad_principal = binding(ResourceType.TOPIC, "t", 3, "alice", "*", AclOperation.READ, ALLOW)
    assert binding_error(bad_principal) is not None
    bad_op = binding(ResourceType.TOPIC, "t", 3, "User:a", "*", AclOperation.ANY, ALLOW)
    assert binding_error(bad_op) is not None


def test_filter_literal_any_and_match() -> None:
    stored = [
        b("orders"),
        b("orders", PatternType.PREFIXED),
        b("ord", PatternType.PREFIXED),
        b("*"),
        b("other"),
    ]
    literal = [x for x in stored if flt("orders", PatternType.LITERAL).matches(x)]
    assert literal == [b("orders")]
    any_ = [x for x in stored if flt("orders", PatternType.ANY).matches(x)]
    assert any_ == [b("orders"), b("orders", PatternType.PREFIXED)]
    match = [x for x in stored if flt("orders", PatternType.MATCH).matches(x)]
    assert match == [b("orders"), b("orders", PatternType.PREFIXED), b("ord", PatternType.PREFIXED), b("*")]
    assert all(flt(None, PatternType.ANY).matches(x) for x in stored)


def test_filter_fields() -> None:
    x = b("t")
    assert AclBindingFilter(
        ResourceType.TOPIC, "t", PatternType.LITERAL, "User:alice", "*", AclOperation.READ, ALLOW
    ).matches(x)
    assert not AclBindingFilter(
        ResourceType.GROUP, None, PatternType.ANY, None, None, AclOperation.ANY, AclPermissionType.ANY
    ).matches(x)
    assert not AclBindingFilter(
        ResourceType.ANY, None, PatternType.ANY, "User:bob", None, AclOperation.ANY, AclPermissionType.ANY
    ).matches(x)
    assert not AclBindingFilter(
        ResourceType.ANY, None, PatternType.ANY, None, None, AclOperation.WRITE, AclPermissionType.ANY
    ).matches(x)
    assert not AclBindingFilter(
        ResourceType.ANY, None, PatternType.ANY, None, None, AclOperation.ANY, AclPermissionType.DENY
    ).matches(x)


def test_json_round_trip() -> None:
    x = binding(
        ResourceType.TRANSACTIONAL_ID,
        "tx-",
        PatternType.PREFIXED,
        "User:a",
        "1.2.3.4",
        AclOperation.WRITE,
        AclPermissionType.DENY,
    )
    assert AclBinding.from_json(x.to_json()) == x
