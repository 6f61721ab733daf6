"""The authorization matrix, in the shape of Kafka's AuthorizerIntegrationTest: every API the
broker speaks, sent by a principal without the ACLs it needs (the right *_AUTHORIZATION_FAILED
code), with only DESCRIBE on the topic where DESCRIBE is not what it needs (still refused), and
with exactly the required ACLs (no authorization error; other errors such as UNKNOWN_MEMBER_ID
are fine). Requests run through ``dispatch`` in process as ``User:alice`` (see authz_broker)."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from tests.server.authz_broker import AUTH_ERRORS, AuthzBroker, error_codes

from exactly.protocol.apis import ApiKey, build
from exactly.records.builder import Record, build_batch
from exactly.security.acl import AclOperation as Op
from exactly.security.acl import ResourceType as R

pytestmark = pytest.mark.timeout(60)

ALICE = "User:alice"
TOPIC = "t"
GROUP = "g"
TXN = "tx"
SECOND = datetime.timedelta(seconds=1)

Acl = tuple[R, str, Op]


def _batch() -> bytes:
    return build_batch(
        [Record(value=b"v", key=None)], producer_id=-1, producer_epoch=-1, base_sequence=-1, base_timestamp=0
    )


@dataclass(frozen=True)
class Case:
    api: ApiKey
    version: int
    fields: Callable[[Any], dict[str, Any]]  # request module -> fields
    acls: tuple[Acl, ...]
    error: int
    topic_describe_is_not_enough: bool = False

    def __str__(self) -> str:
        return f"{self.api.name}-v{self.version}"


def _produce(m: Any) -> dict[str, Any]:
    return {
        "transactional_id": None,
        "acks": 1,
        "timeout": SECOND,
        "topic_data": (
            build(
                m.TopicProduceData,
                name=TOPIC,
                partition_data=(build(m.PartitionProduceData, index=0, records=_batch()),),
            ),
        ),
    }


def _fetch(m: Any) -> dict[str, Any]:
    part = build(
        m.FetchPartition,
        partition=0,
        current_leader_epoch=-1,
        fetch_offset=0,
        log_start_offset=-1,
        partition_max_bytes=1 << 20,
    )
    return {
        "replica_id": -1,
        "max_wait": datetime.timedelta(0),
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "session_epoch": -1,
        "topics": (build(m.FetchTopic, topic=TOPIC, partitions=(part,)),),
        "rack_id": "",
    }


def _txn_offsets(m: Any, topic_cls: str, part_cls: str) -> tuple[Any, ...]:
    part = build(
        getattr(m, part_cls),
        partition_index=0,
        committed_offset=1,
        committed_leader_epoch=-1,
        committed_metadata="",
    )
    return (build(getattr(m, topic_cls), name=TOPIC, partitions=(part,)),)


CASES = [
    Case(ApiKey.PRODUCE, 8, _produce, ((R.TOPIC, TOPIC, Op.WRITE),), 29, True),
    Case(ApiKey.FETCH, 11, _fetch, ((R.TOPIC, TOPIC, Op.READ),), 29, True),
    Case(
        ApiKey.LIST_OFFSETS,
        5,
        lambda m: {
            "replica_id": -1,
            "topics": (
                build(
                    m.ListOffsetsTopic,
                    name=TOPIC,
                    partitions=(
                        build(
                            m.ListOffsetsPartition, partition_index=0, current_leader_epoch=-1, timestamp=-1
                        ),
                    ),
                ),
            ),
        },
        ((R.TOPIC, TOPIC, Op.DESCRIBE),),
        29,
    ),
    Case(
        ApiKey.METADATA,
        9,
        lambda m: {
            "topics": (build(m.MetadataRequestTopic, name=TOPIC),),
            "allow_auto_topic_creation": False,
        },
        ((R.TOPIC, TOPIC, Op.DESCRIBE),),
        29,
    ),
    Case(
        ApiKey.OFFSET_FOR_LEADER_EPOCH,
        3,
        lambda m: {
            "replica_id": -1,
            "topics": (
                build(
                    m.OffsetForLeaderTopic,
                    topic=TOPIC,
                    partitions=(
                        build(
                            m.OffsetForLeaderPartition, partition=0, current_leader_epoch=-1, leader_epoch=0
                        ),
                    ),
                ),
            ),
        },
        ((R.TOPIC, TOPIC, Op.DESCRIBE),),
        29,
    ),
    Case(
        ApiKey.OFFSET_COMMIT,
        8,
        lambda m: {
            "group_id": GROUP,
            "generation_id_or_member_epoch": -1,
            "member_id": "",
            "topics": _txn_offsets(m, "OffsetCommitRequestTopic", "OffsetCommitRequestPartition"),
        },
        ((R.GROUP, GROUP, Op.READ), (R.TOPIC, TOPIC, Op.READ)),
        30,
        True,
    ),
    Case(
        ApiKey.OFFSET_FETCH,
        7,
        lambda m: {
            "group_id": GROUP,
            "topics": (build(m.OffsetFetchRequestTopic, name=TOPIC, partition_indexes=(0,)),),
        },
        ((R.GROUP, GROUP, Op.DESCRIBE), (R.TOPIC, TOPIC, Op.DESCRIBE)),
        30,
    ),
    Case(
        ApiKey.FIND_COORDINATOR,
        3,
        lambda m: {"key": GROUP, "key_type": 0},
        ((R.GROUP, GROUP, Op.DESCRIBE),),
        30,
    ),
    Case(
        ApiKey.FIND_COORDINATOR,
        2,
        lambda m: {"key": TXN, "key_type": 1},
        ((R.TRANSACTIONAL_ID, TXN, Op.DESCRIBE),),
        53,
    ),
    Case(
        ApiKey.JOIN_GROUP,
        5,
        lambda m: {
            "group_id": GROUP,
            "session_timeout": datetime.timedelta(seconds=10),
            "rebalance_timeout": datetime.timedelta(seconds=10),
            "member_id": "",
            "protocol_type": "consumer",
            "protocols": (build(m.JoinGroupRequestProtocol, name="range", metadata=b""),),
        },
        ((R.GROUP, GROUP, Op.READ),),
        30,
    ),
    Case(
        ApiKey.SYNC_GROUP,
        3,
        lambda m: {"group_id": GROUP, "generation_id": 1, "member_id": "m"},
        ((R.GROUP, GROUP, Op.READ),),
        30,
    ),
    Case(
        ApiKey.HEARTBEAT,
        3,
        lambda m: {"group_id": GROUP, "generation_id": 1, "member_id": "m"},
        ((R.GROUP, GROUP, Op.READ),),
        30,
    ),
    Case(
        ApiKey.LEAVE_GROUP,
        3,
        lambda m: {"group_id": GROUP, "members": (build(m.MemberIdentity, member_id="m"),)},
        ((R.GROUP, GROUP, Op.READ),),
        30,
    ),
    Case(ApiKey.DESCRIBE_GROUPS, 5, lambda m: {"groups": (GROUP,)}, ((R.GROUP, GROUP, Op.DESCRIBE),), 30),
    Case(ApiKey.DELETE_GROUPS, 2, lambda m: {"groups_names": (GROUP,)}, ((R.GROUP, GROUP, Op.DELETE),), 30),
    Case(
        ApiKey.INIT_PRODUCER_ID,
        3,
        lambda m: {
            "transactional_id": TXN,
            "transaction_timeout": datetime.timedelta(seconds=60),
            "producer_id": -1,
            "producer_epoch": -1,
        },
        ((R.TRANSACTIONAL_ID, TXN, Op.WRITE),),
        53,
    ),
    Case(
        ApiKey.INIT_PRODUCER_ID,
        4,
        lambda m: {
            "transactional_id": None,
            "transaction_timeout": datetime.timedelta(seconds=60),
            "producer_id": -1,
            "producer_epoch": -1,
        },
        ((R.CLUSTER, "", Op.IDEMPOTENT_WRITE),),
        31,
    ),
    Case(
        ApiKey.ADD_PARTITIONS_TO_TXN,
        3,
        lambda m: {
            "v3_and_below_transactional_id": TXN,
            "v3_and_below_producer_id": 1,
            "v3_and_below_producer_epoch": 0,
            "v3_and_below_topics": (build(m.AddPartitionsToTxnTopic, name=TOPIC, partitions=(0,)),),
        },
        ((R.TRANSACTIONAL_ID, TXN, Op.WRITE), (R.TOPIC, TOPIC, Op.WRITE)),
        53,
        True,
    ),
    Case(
        ApiKey.ADD_OFFSETS_TO_TXN,
        3,
        lambda m: {"transactional_id": TXN, "producer_id": 1, "producer_epoch": 0, "group_id": GROUP},
        ((R.TRANSACTIONAL_ID, TXN, Op.WRITE), (R.GROUP, GROUP, Op.READ)),
        53,
    ),
    Case(
        ApiKey.END_TXN,
        3,
        lambda m: {"transactional_id": TXN, "producer_id": 1, "producer_epoch": 0, "committed": False},
        ((R.TRANSACTIONAL_ID, TXN, Op.WRITE),),
        53,
    ),
    Case(
        ApiKey.TXN_OFFSET_COMMIT,
        3,
        lambda m: {
            "transactional_id": TXN,
            "group_id": GROUP,
            "producer_id": 1,
            "producer_epoch": 0,
            "generation_id": -1,
            "member_id": "",
            "topics": _txn_offsets(m, "TxnOffsetCommitRequestTopic", "TxnOffsetCommitRequestPartition"),
        },
        ((R.TRANSACTIONAL_ID, TXN, Op.WRITE), (R.GROUP, GROUP, Op.READ), (R.TOPIC, TOPIC, Op.READ)),
        53,
        True,
    ),
    Case(
        ApiKey.WRITE_TXN_MARKERS,
        1,
        lambda m: {
            "markers": (
                build(
                    m.WritableTxnMarker,
                    producer_id=1000,
                    producer_epoch=0,
                    transaction_result=False,
                    topics=(build(m.WritableTxnMarkerTopic, name=TOPIC, partition_indexes=(0,)),),
                    coordinator_epoch=0,
                ),
            )
        },
        ((R.CLUSTER, "", Op.CLUSTER_ACTION),),
        31,
    ),
    Case(
        ApiKey.DESCRIBE_PRODUCERS,
        0,
        lambda m: {"topics": (build(m.TopicRequest, name=TOPIC, partition_indexes=(0,)),)},
        ((R.TOPIC, TOPIC, Op.READ),),
        29,
        True,
    ),
    Case(
        ApiKey.DESCRIBE_TRANSACTIONS,
        0,
        lambda m: {"transactional_ids": (TXN,)},
        ((R.TRANSACTIONAL_ID, TXN, Op.DESCRIBE),),
        53,
    ),
    Case(
        ApiKey.CREATE_TOPICS,
        7,
        lambda m: {
            "topics": (build(m.CreatableTopic, name="new", num_partitions=1, replication_factor=1),),
            "timeout": datetime.timedelta(seconds=5),
        },
        ((R.TOPIC, "new", Op.CREATE),),
        29,
    ),
    Case(
        ApiKey.DELETE_TOPICS,
        5,
        lambda m: {"topic_names": (TOPIC,), "timeout": datetime.timedelta(seconds=5)},
        ((R.TOPIC, TOPIC, Op.DELETE),),
        29,
        True,
    ),
    Case(
        ApiKey.CREATE_PARTITIONS,
        3,
        lambda m: {
            "topics": (build(m.CreatePartitionsTopic, name=TOPIC, count=2, assignments=None),),
            "timeout": datetime.timedelta(seconds=5),
            "validate_only": True,
        },
        ((R.TOPIC, TOPIC, Op.ALTER),),
        29,
        True,
    ),
    Case(
        ApiKey.DELETE_RECORDS,
        2,
        lambda m: {
            "topics": (
                build(
                    m.DeleteRecordsTopic,
                    name=TOPIC,
                    partitions=(build(m.DeleteRecordsPartition, partition_index=0, offset=0),),
                ),
            ),
            "timeout": datetime.timedelta(seconds=5),
        },
        ((R.TOPIC, TOPIC, Op.DELETE),),
        29,
        True,
    ),
    Case(
        ApiKey.DESCRIBE_CONFIGS,
        4,
        lambda m: {
            "resources": (
                build(
                    m.DescribeConfigsResource, resource_type=2, resource_name=TOPIC, configuration_keys=None
                ),
            )
        },
        ((R.TOPIC, TOPIC, Op.DESCRIBE_CONFIGS),),
        29,
        True,
    ),
    Case(
        ApiKey.DESCRIBE_CONFIGS,
        4,
        lambda m: {
            "resources": (
                build(m.DescribeConfigsResource, resource_type=4, resource_name="0", configuration_keys=None),
            )
        },
        ((R.CLUSTER, "", Op.DESCRIBE_CONFIGS),),
        31,
    ),
    Case(
        ApiKey.DESCRIBE_ACLS,
        3,
        lambda m: {
            "resource_type_filter": 1,
            "resource_name_filter": None,
            "pattern_type_filter": 1,
            "principal_filter": None,
            "host_filter": None,
            "operation": 1,
            "permission_type": 1,
        },
        ((R.CLUSTER, "", Op.DESCRIBE),),
        31,
    ),
    Case(
        ApiKey.CREATE_ACLS,
        3,
        lambda m: {
            "creations": (
                build(
                    m.AclCreation,
                    resource_type=2,
                    resource_name="x",
                    resource_pattern_type=3,
                    principal="User:bob",
                    host="*",
                    operation=3,
                    permission_type=3,
                ),
            )
        },
        ((R.CLUSTER, "", Op.ALTER),),
        31,
    ),
    Case(
        ApiKey.DELETE_ACLS,
        3,
        lambda m: {
            "filters": (
                build(
                    m.DeleteAclsFilter,
                    resource_type_filter=2,
                    resource_name_filter="x",
                    pattern_type_filter=3,
                    principal_filter=None,
                    host_filter=None,
                    operation=1,
                    permission_type=1,
                ),
            )
        },
        ((R.CLUSTER, "", Op.ALTER),),
        31,
    ),
    Case(
        ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS,
        0,
        lambda m: {"users": None},
        ((R.CLUSTER, "", Op.DESCRIBE),),
        31,
    ),
    Case(
        ApiKey.ALTER_USER_SCRAM_CREDENTIALS,
        0,
        lambda m: {
            "deletions": (),
            "upsertions": (
                build(
                    m.ScramCredentialUpsertion,
                    name="carol",
                    mechanism=2,
                    iterations=4096,
                    salt=b"salt" * 8,
                    salted_password=b"x" * 64,
                ),
            ),
        },
        ((R.CLUSTER, "", Op.ALTER),),
        31,
    ),
]


def run(scenario: Callable[[AuthzBroker], Any], **overrides: str) -> Any:
    async def main() -> Any:
        ab = await AuthzBroker(**overrides).open({TOPIC: 1})
        try:
            return await scenario(ab)
        finally:
            await ab.close()

    return asyncio.run(main())


@pytest.mark.parametrize("case", CASES, ids=str)
def test_api_needs_its_acls(case: Case) -> None:
    async def scenario(ab: AuthzBroker) -> None:
        def req() -> Any:
            return ab.request(case.api, case.version, **case.fields(ab.module(case.api, case.version)))

        codes = error_codes(await ab.send(ALICE, req()))
        assert case.error in codes, f"no ACLs: {codes}"
        if case.topic_describe_is_not_enough:
            await ab.grant(R.TOPIC, TOPIC, Op.DESCRIBE, ALICE)
            codes = error_codes(await ab.send(ALICE, req()))
            assert AUTH_ERRORS & set(codes), f"topic DESCRIBE only: {codes}"
        for rtype, name, op in case.acls:
            await ab.grant(rtype, name, op, ALICE)
        codes = error_codes(await ab.send(ALICE, req()))
        assert not AUTH_ERRORS & set(codes), f"with {case.acls}: {codes}"
        assert ab.broker is not None
        assert sum(ab.broker.metrics.authorization_denied.values()) >= 1

    run(scenario)


def test_every_api_but_api_versions_and_sasl_is_in_the_matrix() -> None:
    covered = {c.api for c in CASES}
    never_authorized = {ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE}
    filtered = {ApiKey.LIST_GROUPS, ApiKey.LIST_TRANSACTIONS, ApiKey.DESCRIBE_CLUSTER}  # tested below
    assert set(ApiKey) - covered == never_authorized | filtered


def test_acl_apis_refuse_malformed_bindings_and_filters_with_invalid_request() -> None:
    async def scenario(ab: AuthzBroker) -> None:
        m = ab.module(ApiKey.CREATE_ACLS, 3)

        def creation(rtype: int, name: str, pattern: int, principal: str = "User:bob", op: int = 3) -> Any:
            return build(
                m.AclCreation,
                resource_type=rtype,
                resource_name=name,
                resource_pattern_type=pattern,
                principal=principal,
                host="*",
                operation=op,
                permission_type=3,
            )

        bad = (
            creation(99, "t", 3),  # no such resource type
            creation(2, "t", 2),  # MATCH is a filter, not a pattern
            creation(4, "not-kafka-cluster", 3),
            creation(2, "", 3),
            creation(2, "t", 3, principal="bob"),
            creation(2, "t", 3, op=1),  # ANY
        )
        created = await ab.call("User:admin", ApiKey.CREATE_ACLS, 3, creations=(*bad, creation(2, "t", 3)))
        assert [int(r.error_code) for r in created.results] == [42] * len(bad) + [0]
        dm = ab.module(ApiKey.DELETE_ACLS, 3)
        flt = build(
            dm.DeleteAclsFilter,
            resource_type_filter=0,
            resource_name_filter=None,
            pattern_type_filter=1,
            principal_filter=None,
            host_filter=None,
            operation=1,
            permission_type=1,
        )
        deleted = await ab.call("User:admin", ApiKey.DELETE_ACLS, 3, filters=(flt,))
        assert [int(r.error_code) for r in deleted.filter_results] == [42]
        described = await ab.describe_acls("User:admin", pattern_type_filter=77)
        assert int(described.error_code) == 42
        assert ab.broker is not None and ab.broker.acls is not None
        everything = await ab.describe_acls("User:admin")
        assert [(r.resource_name, len(r.acls)) for r in everything.resources] == [("t", 1)]

    run(scenario)
