"""The authorizer's decision procedure, in the shapes of Kafka's AclAuthorizerTest and
StandardAuthorizerTest: deny wins, wildcard and prefixed patterns, super users,
allow.everyone.if.no.acl.found, implied operations, hosts, and KIP-679's by-resource-type check."""

from __future__ import annotations

import pytest

from exactly.security.acl import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    binding,
)
from exactly.security.authorizer import (
    Authorizer,
    AuthorizerConfig,
    authorizer_from_config,
)

ALICE = "User:alice"
BOB = "User:bob"
HOST = "10.0.0.1"
OTHER_HOST = "10.0.0.2"
T = ResourceType.TOPIC
Op = AclOperation


def acl(
    name: str,
    op: AclOperation,
    *,
    principal: str = ALICE,
    host: str = "*",
    allow: bool = True,
    pattern: PatternType = PatternType.LITERAL,
    rtype: ResourceType = T,
) -> AclBinding:
    perm = AclPermissionType.ALLOW if allow else AclPermissionType.DENY
    return binding(rtype, name, pattern, principal, host, op, perm)


def authz(*bindings: AclBinding, super_users: str = "", allow_everyone: bool = False) -> Authorizer:
    return Authorizer(AuthorizerConfig.parse(super_users, allow_everyone), bindings)


def test_no_acl_denies_by_default_and_allows_with_allow_everyone() -> None:
    assert not authz().authorize(ALICE, HOST, Op.READ, T, "t")
    assert authz(allow_everyone=True).authorize(ALICE, HOST, Op.READ, T, "t")


def test_allow_everyone_only_applies_to_resources_without_any_acl() -> None:
    a = authz(acl("t", Op.READ, principal=BOB), allow_everyone=True)
    assert not a.authorize(ALICE, HOST, Op.READ, T, "t")  # t has an ACL (for bob): no fallback
    assert a.authorize(ALICE, HOST, Op.READ, T, "other")


def test_literal_allow_is_exact_and_per_operation() -> None:
    a = authz(acl("t", Op.READ))
    assert a.authorize(ALICE, HOST, Op.READ, T, "t")
    assert not a.authorize(ALICE, HOST, Op.WRITE, T, "t")
    assert not a.authorize(ALICE, HOST, Op.READ, T, "t2")
    assert not a.authorize(BOB, HOST, Op.READ, T, "t")
    assert not a.authorize(ALICE, HOST, Op.READ, ResourceType.GROUP, "t")


def test_deny_wins_over_allow_regardless_of_specificity() -> None:
    a = authz(acl("t", Op.READ), acl("*", Op.READ, allow=False))
    assert not a.authorize(ALICE, HOST, Op.READ, T, "t")
    a = authz(acl("*", Op.ALL), acl("t", Op.WRITE, allow=False, principal="User:*"))
    assert not a.authorize(ALICE, HOST, Op.WRITE, T, "t")
    assert a.authorize(ALICE, HOST, Op.READ, T, "t")
    a = authz(acl("t", Op.ALL), acl("t", Op.ALL, allow=False, pattern=PatternType.PREFIXED))
    assert not a.authorize(ALICE, HOST, Op.DESCRIBE, T, "t")


def test_wildcard_resource_and_wildcard_principal() -> None:
    a = authz(acl("*", Op.WRITE, principal="User:*"))
    assert a.authorize(ALICE, HOST, Op.WRITE, T, "anything")
    assert a.authorize(BOB, HOST, Op.WRITE, T, "x")
    assert not a.authorize(BOB, HOST, Op.READ, T, "x")


def test_prefixed_patterns_match_names_that_start_with_them() -> None:
    a = authz(acl("orders-", Op.READ, pattern=PatternType.PREFIXED))
    assert a.authorize(ALICE, HOST, Op.READ, T, "orders-eu")
    assert a.authorize(ALICE, HOST, Op.READ, T, "orders-")
    assert not a.authorize(ALICE, HOST, Op.READ, T, "orders")
    assert not a.authorize(ALICE, HOST, Op.READ, T, "xorders-eu")
    # a literal ACL named "orders-" is not a prefix
    assert not authz(acl("orders-", Op.READ)).authorize(ALICE, HOST, Op.READ, T, "orders-eu")


def test_all_operation_matches_everything() -> None:
    a = authz(acl("t", Op.ALL))
    for op in (Op.READ, Op.WRITE, Op.CREATE, Op.DELETE, Op.ALTER, Op.DESCRIBE, Op.DESCRIBE_CONFIGS):
        assert a.authorize(ALICE, HOST, op, T, "t"), op


@pytest.mark.parametrize("granted", [Op.READ, Op.WRITE, Op.DELETE, Op.ALTER])
def test_allow_implies_describe(granted: AclOperation) -> None:
    assert authz(acl("t", granted)).authorize(ALICE, HOST, Op.DESCRIBE, T, "t")


def test_alter_configs_implies_describe_configs_and_nothing_else_is_implied() -> None:
    a = authz(acl("t", Op.ALTER_CONFIGS))
    assert a.authorize(ALICE, HOST, Op.DESCRIBE_CONFIGS, T, "t")
    assert not a.authorize(ALICE, HOST, Op.DESCRIBE, T, "t")
    assert not authz(acl("t", Op.DESCRIBE)).authorize(ALICE, HOST, Op.READ, T, "t")
    assert not authz(acl("t", Op.CREATE)).authorize(ALICE, HOST, Op.DESCRIBE, T, "t")


def test_deny_is_never_implied() -> None:
    a = authz(acl("t", Op.ALL), acl("t", Op.READ, allow=False))
    assert not a.authorize(ALICE, HOST, Op.READ, T, "t")
    assert a.authorize(ALICE, HOST, Op.DESCRIBE, T, "t")  # DENY READ does not deny DESCRIBE


def test_host_matching() -> None:
    a = authz(acl("t", Op.READ, host=HOST))
    assert a.authorize(ALICE, HOST, Op.READ, T, "t")
    assert not a.authorize(ALICE, OTHER_HOST, Op.READ, T, "t")
    a = authz(acl("t", Op.READ), acl("t", Op.READ, host=OTHER_HOST, allow=False))
    assert a.authorize(ALICE, HOST, Op.READ, T, "t")
    assert not a.authorize(ALICE, OTHER_HOST, Op.READ, T, "t")


def test_super_users_bypass_acls_including_deny() -> None:
    a = authz(acl("t", Op.ALL, principal="User:*", allow=False), super_users="User:admin; User:ANONYMOUS")
    assert a.authorize("User:admin", HOST, Op.WRITE, T, "t")
    assert a.authorize("User:ANONYMOUS", HOST, Op.WRITE, T, "t")
    assert not a.authorize(ALICE, HOST, Op.WRITE, T, "t")


def test_replace_takes_effect_immediately() -> None:
    a = authz()
    assert not a.authorize(ALICE, HOST, Op.WRITE, T, "t")
    a.replace([acl("t", Op.WRITE)])
    assert a.authorize(ALICE, HOST, Op.WRITE, T, "t")
    a.replace([])
    assert not a.authorize(ALICE, HOST, Op.WRITE, T, "t")


def test_authorize_by_resource_type() -> None:
    """KIP-679 (Kafka's AuthorizerInterfaceDefaultTest shapes)."""
    W = Op.WRITE

    def by_type(*bindings: AclBinding) -> bool:
        return authz(*bindings).authorize_by_resource_type(ALICE, HOST, W, T)

    assert not by_type()
    assert by_type(acl("t", W))
    assert by_type(acl("t", Op.ALL))
    assert not by_type(acl("t", Op.READ))
    assert not by_type(acl("t", W), acl("t", W, allow=False))  # literal deny cancels same name
    assert by_type(acl("t", W), acl("u", W, allow=False))
    assert not by_type(acl("t", W), acl("*", W, allow=False))  # wildcard deny cancels all
    assert by_type(acl("*", W))
    assert not by_type(acl("tx", W), acl("t", W, allow=False, pattern=PatternType.PREFIXED))
    assert by_type(
        acl("ab", W, pattern=PatternType.PREFIXED), acl("abc", W, allow=False, pattern=PatternType.PREFIXED)
    )
    assert not by_type(acl("t", W, principal=BOB))
    assert authz(super_users=ALICE).authorize_by_resource_type(ALICE, HOST, W, T)
    assert authz(allow_everyone=True).authorize_by_resource_type(ALICE, HOST, W, T)


def test_authorizer_from_config() -> None:
    assert authorizer_from_config({}) is None
    assert authorizer_from_config({"authorizer.class.name": ""}) is None
    for name in (
        "kafka.security.authorizer.AclAuthorizer",
        "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    ):
        a = authorizer_from_config({"authorizer.class.name": name, "super.users": "User:admin"})
        assert a is not None and a.is_super_user("User:admin")
        assert not a.config.allow_everyone_if_no_acl_found
    with pytest.raises(ValueError, match="not supported"):
        authorizer_from_config({"authorizer.class.name": "com.example.Typo"})
