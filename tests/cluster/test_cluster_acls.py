"""A three-broker cluster with the ACL authorizer on: replication, the transaction coordinator's
markers and KIP-890 verification keep working (brokers reach each other as ``User:ANONYMOUS``
over PLAINTEXT and that principal holds CLUSTER_ACTION), and an ACL created through one broker
reaches every broker through ZooKeeper, without a restart.

The cluster's first ACLs are seeded in ZooKeeper before the brokers start (as Kafka operators
do with ``kafka-acls --authorizer-properties zookeeper.connect=...``): ANONYMOUS gets
CLUSTER_ACTION (inter-broker traffic) and ALTER, DESCRIBE, CREATE on the cluster (these tests
create topics and ACLs); topic, group and transactional-id rights come later through the API.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from exactly.cluster.zk import ClusterZk
from exactly.cluster.zk_acls import ZkAclStore
from exactly.security import acl
from exactly.security.authorizer import Authorizer, AuthorizerConfig
from tests.cluster.helpers import bootstrap, running_cluster, wait_for
from tests.support.broker import Broker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ANON = "User:ANONYMOUS"


@pytest.fixture
def cluster(zk: ClusterZk, zk_connect: str, tmp_path: Path) -> Iterator[list[Broker]]:
    seed = ZkAclStore(zk.client, Authorizer(AuthorizerConfig(frozenset(), False)))
    seed.add(
        acl.binding(acl.ResourceType.CLUSTER, acl.CLUSTER_NAME, 3, ANON, "*", op, acl.AclPermissionType.ALLOW)
        for op in (
            acl.AclOperation.CLUSTER_ACTION,
            acl.AclOperation.ALTER,
            acl.AclOperation.DESCRIBE,
            acl.AclOperation.CREATE,
        )
    )
    yield from running_cluster(
        zk_connect,
        tmp_path,
        **{
            "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
            "super.users": "User:admin",
            "auto.create.topics.enable": "false",
        },
    )


def _allow(rtype: ResourceType, name: str, op: AclOperation) -> AclBinding:
    return AclBinding(rtype, name, ResourcePatternType.LITERAL, ANON, "*", op, AclPermissionType.ALLOW)


def _topic_acls(admin: AdminClient, topic: str) -> list[AclBinding]:
    flt = AclBindingFilter(
        ResourceType.TOPIC,
        topic,
        ResourcePatternType.LITERAL,
        None,
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    return list(admin.describe_acls(flt, request_timeout=10).result())


def test_cluster_works_with_the_authorizer_and_acls_reach_every_broker(
    cluster: list[Broker], zk: ClusterZk
) -> None:
    topic = f"acl-{uuid.uuid4().hex[:8]}"
    tid = f"acl-tx-{uuid.uuid4().hex[:8]}"
    group = f"acl-g-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap(cluster)})
    wait_for(lambda: len(admin.list_topics(timeout=5).brokers) == 3, what="three brokers")
    admin.create_topics([NewTopic(topic, 1, 3, config={"min.insync.replicas": "2"})])[topic].result(30)

    # no rights on the topic yet: the transactional producer cannot even start
    p = Producer(
        {"bootstrap.servers": bootstrap(cluster), "transactional.id": tid, "transaction.timeout.ms": 30000}
    )
    with pytest.raises(Exception) as denied:
        p.init_transactions(20)
    assert denied.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED

    # the grants go through the first broker only ...
    first = AdminClient({"bootstrap.servers": cluster[0].bootstrap})
    grants = [
        _allow(ResourceType.TOPIC, topic, AclOperation.WRITE),
        _allow(ResourceType.TOPIC, topic, AclOperation.READ),
        _allow(ResourceType.TRANSACTIONAL_ID, tid, AclOperation.WRITE),
        _allow(ResourceType.GROUP, group, AclOperation.READ),
    ]
    for f in first.create_acls(grants, request_timeout=10).values():
        f.result()
    # ... and every broker answers with them (ZooKeeper watch)
    for b in cluster:
        one = AdminClient({"bootstrap.servers": b.bootstrap})
        wait_for(lambda one=one: len(_topic_acls(one, topic)) == 2, what=f"ACLs on {b.name}")
    assert zk.client.exists(f"/kafka-acl/Topic/{topic}") is not None

    # transactional produce with acks=all on RF 3: replication (follower fetches), KIP-890
    # verification and the coordinator's markers all run between brokers as ANONYMOUS
    p = Producer(
        {"bootstrap.servers": bootstrap(cluster), "transactional.id": tid, "transaction.timeout.ms": 30000}
    )
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(10):
        p.produce(topic, b"v%d" % i)
    p.commit_transaction(30)

    c = Consumer(
        {
            "bootstrap.servers": bootstrap(cluster),
            "group.id": group,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe([topic])
    values: list[bytes] = []
    wait_for(
        lambda: values.extend(m.value() for m in c.consume(10, 1) if m.error() is None) or len(values) >= 10,
        timeout=60,
        what="ten committed records",
    )
    c.commit(asynchronous=False)
    c.close()
    assert values == [b"v%d" % i for i in range(10)]
