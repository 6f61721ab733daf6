"""ACLs in ZooKeeper (exactly.cluster.zk_acls) on a real ZooKeeper: Kafka's znode layout and
JSON, compare-and-set updates, empty resources removed, change notifications, and a second
broker's store seeing a change through its watch without a restart."""

from __future__ import annotations

import json
from collections.abc import Callable

from exactly.cluster.zk import ClusterZk
from exactly.cluster.zk_acls import EXTENDED_CHANGES, LITERAL_CHANGES, ZkAclStore
from exactly.security.acl import (
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    binding,
)
from exactly.security.authorizer import Authorizer, AuthorizerConfig
from tests.cluster.helpers import wait_for

ALLOW = AclPermissionType.ALLOW
EVERYTHING = AclBindingFilter(
    ResourceType.ANY, None, PatternType.ANY, None, None, AclOperation.ANY, AclPermissionType.ANY
)


def _store(zk: ClusterZk) -> tuple[ZkAclStore, Authorizer]:
    a = Authorizer(AuthorizerConfig(frozenset(), False))
    return ZkAclStore(zk.client, a), a


def test_layout_and_round_trip(zk: ClusterZk) -> None:
    store, a = _store(zk)
    read = binding(
        ResourceType.TOPIC, "orders", PatternType.LITERAL, "User:alice", "*", AclOperation.READ, ALLOW
    )
    write = binding(
        ResourceType.TOPIC, "orders", PatternType.LITERAL, "User:bob", "10.0.0.1", AclOperation.WRITE, ALLOW
    )
    tx = binding(
        ResourceType.TRANSACTIONAL_ID,
        "tx-",
        PatternType.PREFIXED,
        "User:bob",
        "*",
        AclOperation.IDEMPOTENT_WRITE,
        AclPermissionType.DENY,
    )
    store.add([read, write, tx])
    data, _ = zk.client.get("/kafka-acl/Topic/orders")
    assert json.loads(data) == {
        "version": 1,
        "acls": [
            {"principal": "User:alice", "permissionType": "Allow", "operation": "Read", "host": "*"},
            {"principal": "User:bob", "permissionType": "Allow", "operation": "Write", "host": "10.0.0.1"},
        ],
    }
    data, _ = zk.client.get("/kafka-acl-extended/prefixed/TransactionalId/tx-")
    assert json.loads(data)["acls"] == [
        {"principal": "User:bob", "permissionType": "Deny", "operation": "IdempotentWrite", "host": "*"}
    ]
    literal_changes = zk.client.get_children(LITERAL_CHANGES)
    assert len(literal_changes) == 1 and literal_changes[0].startswith("acl_changes_")
    assert zk.client.get(f"{LITERAL_CHANGES}/{literal_changes[0]}")[0] == b"Topic:orders"
    assert len(zk.client.get_children(EXTENDED_CHANGES)) == 1
    assert a.authorize("User:alice", "h", AclOperation.READ, ResourceType.TOPIC, "orders")
    assert sorted(store.load_all(), key=str) == sorted([read, write, tx], key=str)

    removed = store.remove(
        [
            AclBindingFilter(
                ResourceType.TOPIC,
                "orders",
                PatternType.LITERAL,
                None,
                None,
                AclOperation.ANY,
                AclPermissionType.ANY,
            )
        ]
    )
    assert sorted(removed[0], key=str) == sorted([read, write], key=str)
    assert zk.client.exists("/kafka-acl/Topic/orders") is None  # emptied: removed
    assert store.describe(EVERYTHING) == [tx]
    assert not a.authorize("User:alice", "h", AclOperation.READ, ResourceType.TOPIC, "orders")


def test_another_brokers_store_follows_through_its_watch(cluster_zk: Callable[[], ClusterZk]) -> None:
    one, _ = _store(cluster_zk())
    two, authorizer_two = _store(cluster_zk())
    two.watch()
    grant = binding(ResourceType.GROUP, "g", PatternType.LITERAL, "User:carol", "*", AclOperation.READ, ALLOW)
    assert not authorizer_two.authorize("User:carol", "h", AclOperation.READ, ResourceType.GROUP, "g")
    one.add([grant])
    wait_for(
        lambda: authorizer_two.authorize("User:carol", "h", AclOperation.READ, ResourceType.GROUP, "g"),
        what="the watch",
    )
    # both add to the same resource: compare-and-set keeps both entries
    other = binding(ResourceType.GROUP, "g", PatternType.LITERAL, "User:dave", "*", AclOperation.READ, ALLOW)
    two.add([other])
    assert sorted(one.load_all(), key=str) == sorted([grant, other], key=str)
    one.remove([EVERYTHING])
    wait_for(lambda: not authorizer_two.bindings(), what="the removal to reach the second store")
