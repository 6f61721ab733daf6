"""Authorization around transactions, listings and the denial trail, in process (see authz_broker).

* A principal without WRITE on a transactional id cannot init it, so cannot fence its owner's
  producer, and cannot abort the owner's open transaction: the owner commits afterwards.
* Listings are filtered silently (ListTransactions, ListGroups, Metadata for all topics), and
  DescribeTransactions strips topics the caller may not describe.
* Each denial is an ``exactly.audit`` line and a count in ``exactly_authorization_denied_total``.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import generate_latest
from tests.server.authz_broker import ADMIN, AuthzBroker, error_codes

from exactly.protocol.apis import ApiKey, build
from exactly.records.builder import Record, build_batch
from exactly.security.acl import AclOperation as Op
from exactly.security.acl import ResourceType as R
from exactly.server.prometheus import make_registry

pytestmark = pytest.mark.timeout(60)

ALICE = "User:alice"
MALLORY = "User:mallory"
TXN = "orders-tx"
TOPIC = "orders"
MINUTE = datetime.timedelta(seconds=60)


def run(scenario: Callable[[AuthzBroker], Any]) -> Any:
    async def main() -> Any:
        ab = await AuthzBroker().open({TOPIC: 1, "secret": 1})
        try:
            return await scenario(ab)
        finally:
            await ab.close()

    return asyncio.run(main())


async def _init(ab: AuthzBroker, principal: str, tid: str | None = TXN) -> Any:
    return await ab.call(
        principal,
        ApiKey.INIT_PRODUCER_ID,
        3,
        transactional_id=tid,
        transaction_timeout=MINUTE,
        producer_id=-1,
        producer_epoch=-1,
    )


async def _describe_txn(ab: AuthzBroker, principal: str = ADMIN) -> Any:
    (state,) = (
        await ab.call(principal, ApiKey.DESCRIBE_TRANSACTIONS, 0, transactional_ids=(TXN,))
    ).transaction_states
    return state


async def _end(ab: AuthzBroker, principal: str, pid: int, epoch: int, commit: bool) -> int:
    r = await ab.call(
        principal,
        ApiKey.END_TXN,
        3,
        transactional_id=TXN,
        producer_id=pid,
        producer_epoch=epoch,
        committed=commit,
    )
    return int(r.error_code)


async def _open_transaction(ab: AuthzBroker) -> tuple[int, int]:
    """alice (WRITE on the id and the topic) opens a transaction with one record in it."""
    await ab.grant(R.TRANSACTIONAL_ID, TXN, Op.WRITE, ALICE)
    await ab.grant(R.TOPIC, TOPIC, Op.WRITE, ALICE)
    init = await _init(ab, ALICE)
    assert init.error_code == 0
    pid, epoch = int(init.producer_id), int(init.producer_epoch)
    m = ab.module(ApiKey.ADD_PARTITIONS_TO_TXN, 3)
    added = await ab.call(
        ALICE,
        ApiKey.ADD_PARTITIONS_TO_TXN,
        3,
        v3_and_below_transactional_id=TXN,
        v3_and_below_producer_id=pid,
        v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=(build(m.AddPartitionsToTxnTopic, name=TOPIC, partitions=(0,)),),
    )
    assert set(error_codes(added)) == {0}
    produced = await _produce_transactional(ab, ALICE, pid, epoch, sequence=0)
    assert set(error_codes(produced)) == {0}
    return pid, epoch


async def _produce_transactional(ab: AuthzBroker, principal: str, pid: int, epoch: int, sequence: int) -> Any:
    """One transactional record to ``TOPIC``-0 as ``principal``, with ``TXN``'s producer id and epoch."""
    batch = build_batch(
        [Record(value=b"v", key=None)],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=sequence,
        transactional=True,
    )
    pm = ab.module(ApiKey.PRODUCE, 8)
    return await ab.call(
        principal,
        ApiKey.PRODUCE,
        8,
        transactional_id=TXN,
        acks=1,
        timeout=MINUTE,
        topic_data=(
            build(
                pm.TopicProduceData,
                name=TOPIC,
                partition_data=(build(pm.PartitionProduceData, index=0, records=batch),),
            ),
        ),
    )


def test_without_write_on_the_transactional_id_no_init_no_fencing_no_abort() -> None:
    async def scenario(ab: AuthzBroker) -> None:
        pid, epoch = await _open_transaction(ab)
        # mallory may write the topic and describe the id: neither is WRITE on the id
        await ab.grant(R.TOPIC, TOPIC, Op.WRITE, MALLORY)
        await ab.grant(R.TRANSACTIONAL_ID, TXN, Op.DESCRIBE, MALLORY)
        assert (await _init(ab, MALLORY)).error_code == 53
        assert await _end(ab, MALLORY, pid, epoch, commit=False) == 53
        produced = await _produce_transactional(ab, MALLORY, pid, epoch, sequence=1)
        assert error_codes(produced) == [53]
        state = await _describe_txn(ab)
        assert (state.transaction_state, int(state.producer_id), int(state.producer_epoch)) == (
            "Ongoing",
            pid,
            epoch,
        )
        # the owner was neither fenced nor aborted: its commit goes through
        assert await _end(ab, ALICE, pid, epoch, commit=True) == 0
        assert (await _describe_txn(ab)).transaction_state in ("PrepareCommit", "CompleteCommit")

    run(scenario)


def test_idempotent_init_with_write_on_some_topic() -> None:
    """KIP-679: an idempotent producer needs IDEMPOTENT_WRITE on the cluster or WRITE on a topic."""

    async def scenario(ab: AuthzBroker) -> None:
        assert (await _init(ab, ALICE, None)).error_code == 31
        await ab.grant(R.TOPIC, "anything-", Op.WRITE, ALICE, pattern=4)
        assert (await _init(ab, ALICE, None)).error_code == 0

    run(scenario)


def test_listings_are_filtered_and_describe_strips_topics() -> None:
    async def scenario(ab: AuthzBroker) -> None:
        await _open_transaction(ab)
        carol = "User:carol"
        listed = await ab.call(carol, ApiKey.LIST_TRANSACTIONS, 0, state_filters=(), producer_id_filters=())
        assert listed.error_code == 0 and listed.transaction_states == ()
        await ab.grant(R.TRANSACTIONAL_ID, "orders-", Op.DESCRIBE, carol, pattern=4)
        listed = await ab.call(carol, ApiKey.LIST_TRANSACTIONS, 0, state_filters=(), producer_id_filters=())
        assert [t.transactional_id for t in listed.transaction_states] == [TXN]
        state = await _describe_txn(ab, carol)
        assert state.error_code == 0 and state.topics == ()  # the topic is stripped
        await ab.grant(R.TOPIC, TOPIC, Op.DESCRIBE, carol)
        assert [t.topic for t in (await _describe_txn(ab, carol)).topics] == [TOPIC]

        # Metadata for all topics: only what the caller may describe, no error
        meta = await ab.call(ALICE, ApiKey.METADATA, 9, topics=None, allow_auto_topic_creation=False)
        assert [t.name for t in meta.topics] == [TOPIC]
        named = await ab.call(
            ALICE,
            ApiKey.METADATA,
            9,
            topics=tuple(
                build(ab.module(ApiKey.METADATA, 9).MetadataRequestTopic, name=n) for n in ("secret", "nope")
            ),
            allow_auto_topic_creation=False,
        )
        # an existing and a missing topic look the same: 29, no partitions
        assert [(t.name, t.error_code, t.partitions) for t in named.topics] == [
            ("secret", 29, ()),
            ("nope", 29, ()),
        ]

        # ListGroups: filtered by DESCRIBE on each group unless DESCRIBE on the cluster
        jm = ab.module(ApiKey.JOIN_GROUP, 5)
        for g in ("g1", "g2"):
            await ab.call(
                ADMIN,
                ApiKey.JOIN_GROUP,
                5,
                group_id=g,
                session_timeout=datetime.timedelta(seconds=10),
                rebalance_timeout=datetime.timedelta(seconds=10),
                member_id="",
                protocol_type="consumer",
                protocols=(build(jm.JoinGroupRequestProtocol, name="range", metadata=b""),),
            )
        groups = await ab.call(ALICE, ApiKey.LIST_GROUPS, 3)
        assert groups.error_code == 0 and groups.groups == ()
        await ab.grant(R.GROUP, "g2", Op.DESCRIBE, ALICE)
        assert [g.group_id for g in (await ab.call(ALICE, ApiKey.LIST_GROUPS, 3)).groups] == ["g2"]
        await ab.grant(R.CLUSTER, "", Op.DESCRIBE, ALICE)
        assert [g.group_id for g in (await ab.call(ALICE, ApiKey.LIST_GROUPS, 3)).groups] == ["g1", "g2"]

    run(scenario)


def test_denials_are_audited_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(ab: AuthzBroker) -> str:
        with caplog.at_level(logging.INFO, logger="exactly.audit"):
            assert (await _init(ab, MALLORY)).error_code == 53
        assert ab.broker is not None
        assert ab.broker.metrics.authorization_denied[("TRANSACTIONAL_ID", "WRITE")] == 1
        return generate_latest(make_registry(ab.broker)).decode()

    exposition = run(scenario)
    (line,) = [r.getMessage() for r in caplog.records if r.name == "exactly.audit"]
    for part in (
        "DENIED",
        "principal=User:mallory",
        "host=10.1.2.3",
        "operation=WRITE",
        f"TRANSACTIONAL_ID:'{TXN}'",
        "INIT_PRODUCER_ID",
    ):
        assert part in line
    assert (
        'exactly_authorization_denied_total{operation="WRITE",resource_type="TRANSACTIONAL_ID"} 1.0'
        in exposition
    )


def test_host_restricted_acl() -> None:
    async def scenario(ab: AuthzBroker) -> None:
        await ab.grant(R.TRANSACTIONAL_ID, TXN, Op.WRITE, ALICE, host="10.1.2.3")
        assert (await _init(ab, ALICE)).error_code == 0
        r = await ab.send(
            ALICE,
            ab.request(
                ApiKey.INIT_PRODUCER_ID,
                3,
                transactional_id=TXN,
                transaction_timeout=MINUTE,
                producer_id=-1,
                producer_epoch=-1,
            ),
            peer="10.9.9.9:1",
        )
        assert r.error_code == 53

    run(scenario)


def test_describe_groups_reports_the_callers_authorized_operations() -> None:
    async def scenario(ab: AuthzBroker) -> None:
        await ab.grant(R.GROUP, "g", Op.DESCRIBE, ALICE)
        (g,) = (
            await ab.call(ALICE, ApiKey.DESCRIBE_GROUPS, 5, groups=("g",), include_authorized_operations=True)
        ).groups
        assert (g.error_code, g.authorized_operations) == (0, 1 << Op.DESCRIBE)
        await ab.grant(R.GROUP, "g", Op.DELETE, ALICE)
        (g,) = (
            await ab.call(ALICE, ApiKey.DESCRIBE_GROUPS, 5, groups=("g",), include_authorized_operations=True)
        ).groups
        assert g.authorized_operations == (1 << Op.DESCRIBE) | (1 << Op.DELETE)

    run(scenario)
