"""Group APIs at every served version, on the wire: one member's full life cycle per JoinGroup
version, and the error codes Kafka answers for the edge cases clients rarely hit."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from exactly.protocol.apis import VERSION_RANGES, ApiKey, build, schema
from tests.support.broker import Broker
from tests.support.clients import create_topic
from tests.support.wire import WireClient

pytestmark = pytest.mark.timeout(60)

NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_REQUEST = 42
ILLEGAL_GENERATION = 22
INCONSISTENT_GROUP_PROTOCOL = 23
UNKNOWN_MEMBER_ID = 25
INVALID_SESSION_TIMEOUT = 26
REBALANCE_IN_PROGRESS = 27
MEMBER_ID_REQUIRED = 79


def req(key: ApiKey, version: int, /, **fields: Any) -> Any:
    return build(schema(key, version).request_type, **fields)


def mod(key: ApiKey, version: int) -> Any:
    return schema(key, version).request_module


def ms(n: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=n)


def clamp(key: ApiKey, v: int) -> int:
    lo, hi = VERSION_RANGES[key]
    return max(lo, min(hi, v))


def join(
    c: WireClient, version: int, group_id: str, member_id: str = "", session_ms: int = 10_000, **extra: Any
) -> Any:
    m = mod(ApiKey.JOIN_GROUP, version)
    return c.send(
        req(
            ApiKey.JOIN_GROUP,
            version,
            group_id=group_id,
            session_timeout=ms(session_ms),
            rebalance_timeout=ms(10_000),
            member_id=member_id,
            protocol_type="consumer",
            protocols=(build(m.JoinGroupRequestProtocol, name="range", metadata=b"subscription"),),
            **extra,
        )
    )


@pytest.mark.parametrize(
    "version", range(VERSION_RANGES[ApiKey.JOIN_GROUP][0], VERSION_RANGES[ApiKey.JOIN_GROUP][1] + 1)
)
def test_member_life_cycle_at_each_version(gb: Broker, topic: str, group: str, version: int) -> None:
    create_topic(gb.bootstrap, topic, partitions=1)
    with WireClient(gb.bootstrap) as c:
        fv = clamp(ApiKey.FIND_COORDINATOR, version)
        if fv < 4:
            found = c.send(req(ApiKey.FIND_COORDINATOR, fv, key=group, key_type=0))
        else:
            (found,) = c.send(
                req(ApiKey.FIND_COORDINATOR, fv, key_type=0, coordinator_keys=(group,))
            ).coordinators
        assert (found.error_code, int(found.node_id), int(found.port)) == (NONE, 0, gb.port)

        joined = join(c, version, group)
        if version >= 4:  # KIP-394: get an id first
            assert joined.error_code == MEMBER_ID_REQUIRED and joined.member_id
            joined = join(c, version, group, member_id=joined.member_id)
        assert joined.error_code == NONE
        member_id = joined.member_id
        assert int(joined.generation_id) == 1
        assert joined.leader == member_id
        assert joined.protocol_name == "range"
        assert [(m.member_id, m.metadata) for m in joined.members] == [(member_id, b"subscription")]

        sv = clamp(ApiKey.SYNC_GROUP, version)
        sm = mod(ApiKey.SYNC_GROUP, sv)
        synced = c.send(
            req(
                ApiKey.SYNC_GROUP,
                sv,
                group_id=group,
                generation_id=1,
                member_id=member_id,
                protocol_type="consumer",
                protocol_name="range",
                assignments=(
                    build(sm.SyncGroupRequestAssignment, member_id=member_id, assignment=b"assigned"),
                ),
            )
        )
        assert (synced.error_code, synced.assignment) == (NONE, b"assigned")

        hv = clamp(ApiKey.HEARTBEAT, version)
        beat = c.send(req(ApiKey.HEARTBEAT, hv, group_id=group, generation_id=1, member_id=member_id))
        assert beat.error_code == NONE
        beat = c.send(req(ApiKey.HEARTBEAT, hv, group_id=group, generation_id=7, member_id=member_id))
        assert beat.error_code == ILLEGAL_GENERATION

        cv = clamp(ApiKey.OFFSET_COMMIT, version)
        cm = mod(ApiKey.OFFSET_COMMIT, cv)
        committed = c.send(
            req(
                ApiKey.OFFSET_COMMIT,
                cv,
                group_id=group,
                generation_id_or_member_epoch=1,
                member_id=member_id,
                retention_time=ms(-1),
                topics=(
                    build(
                        cm.OffsetCommitRequestTopic,
                        name=topic,
                        partitions=(
                            build(
                                cm.OffsetCommitRequestPartition,
                                partition_index=0,
                                committed_offset=42,
                                committed_leader_epoch=-1,
                                committed_metadata="m",
                            ),
                        ),
                    ),
                ),
            )
        )
        assert [
            (t.name, [(p.partition_index, p.error_code) for p in t.partitions]) for t in committed.topics
        ] == [(topic, [(0, NONE)])]

        fetched = _offset_fetch(c, clamp(ApiKey.OFFSET_FETCH, version), group, topic)
        assert fetched == [(topic, 0, 42, "m", NONE)]

        lv = clamp(ApiKey.LEAVE_GROUP, version)
        if lv < 3:
            left = c.send(req(ApiKey.LEAVE_GROUP, lv, group_id=group, member_id=member_id))
            assert left.error_code == NONE
        else:
            lm = mod(ApiKey.LEAVE_GROUP, lv)
            left = c.send(
                req(
                    ApiKey.LEAVE_GROUP,
                    lv,
                    group_id=group,
                    members=(build(lm.MemberIdentity, member_id=member_id),),
                )
            )
            assert left.error_code == NONE
            assert [(m.member_id, m.error_code) for m in left.members] == [(member_id, NONE)]
        beat = c.send(req(ApiKey.HEARTBEAT, hv, group_id=group, generation_id=1, member_id=member_id))
        assert beat.error_code == UNKNOWN_MEMBER_ID
        # the offsets outlive the membership
        assert _offset_fetch(c, clamp(ApiKey.OFFSET_FETCH, version), group, topic) == [
            (topic, 0, 42, "m", NONE)
        ]


def _offset_fetch(
    c: WireClient, version: int, group_id: str, topic: str | None
) -> list[tuple[str, int, int, str, int]]:
    m = mod(ApiKey.OFFSET_FETCH, version)
    if version >= 8:
        topics = (
            None
            if topic is None
            else (build(m.OffsetFetchRequestTopics, name=topic, partition_indexes=(0,)),)
        )
        resp = c.send(
            req(
                ApiKey.OFFSET_FETCH,
                version,
                groups=(build(m.OffsetFetchRequestGroup, group_id=group_id, topics=topics),),
            )
        )
        (g,) = resp.groups
        assert g.group_id == group_id and g.error_code == NONE
        result_topics = g.topics
    else:
        topics = (
            None if topic is None else (build(m.OffsetFetchRequestTopic, name=topic, partition_indexes=(0,)),)
        )
        resp = c.send(req(ApiKey.OFFSET_FETCH, version, group_id=group_id, topics=topics))
        assert getattr(resp, "error_code", NONE) == NONE
        result_topics = resp.topics
    return [
        (t.name, p.partition_index, int(p.committed_offset), p.metadata, p.error_code)
        for t in result_topics
        for p in t.partitions
    ]


# ---------------------------------------------------------------------------- edge cases
@pytest.mark.parametrize("version", [1, 3, 7, 8])
def test_offset_fetch_unknown_group(gb: Broker, topic: str, group: str, version: int) -> None:
    create_topic(gb.bootstrap, topic, partitions=1)
    with WireClient(gb.bootstrap) as c:
        assert _offset_fetch(c, version, group, topic) == [(topic, 0, -1, "", NONE)]
        if version >= 2:  # all offsets of the group: none
            assert _offset_fetch(c, version, group, None) == []


@pytest.mark.parametrize("version", [1, 3, 4, 5])
def test_find_coordinator_invalid_key_type(gb: Broker, version: int) -> None:
    with WireClient(gb.bootstrap) as c:
        if version < 4:
            resp = c.send(req(ApiKey.FIND_COORDINATOR, version, key="k", key_type=7))
            assert (resp.error_code, int(resp.node_id), resp.host, int(resp.port)) == (
                INVALID_REQUEST,
                -1,
                "",
                -1,
            )
            ok = c.send(req(ApiKey.FIND_COORDINATOR, version, key="txn-id", key_type=1))
            assert (ok.error_code, ok.error_message, int(ok.port)) == (NONE, "NONE", gb.port)
        else:
            resp = c.send(req(ApiKey.FIND_COORDINATOR, version, key_type=7, coordinator_keys=("a", "b")))
            assert [(x.key, x.error_code) for x in resp.coordinators] == [
                ("a", INVALID_REQUEST),
                ("b", INVALID_REQUEST),
            ]
            ok = c.send(req(ApiKey.FIND_COORDINATOR, version, key_type=1, coordinator_keys=("t1", "t2")))
            assert [(x.key, x.error_code, int(x.port)) for x in ok.coordinators] == [
                ("t1", NONE, gb.port),
                ("t2", NONE, gb.port),
            ]


def test_join_group_errors(gb: Broker, group: str) -> None:
    with WireClient(gb.bootstrap) as c:
        assert join(c, 5, group, session_ms=1000).error_code == INVALID_SESSION_TIMEOUT  # < group.min.session
        assert join(c, 5, group, member_id="never-issued").error_code == UNKNOWN_MEMBER_ID
        joined = join(c, 7, group, member_id="never-issued")
        assert joined.error_code == UNKNOWN_MEMBER_ID
        assert joined.protocol_name is None and joined.protocol_type is None  # nullable from v7
        old = join(c, 6, group, member_id="never-issued")
        assert (old.error_code, old.protocol_name) == (UNKNOWN_MEMBER_ID, "")


def test_sync_group_v5_requires_protocol(gb: Broker, group: str) -> None:
    with WireClient(gb.bootstrap) as c:
        resp = c.send(
            req(
                ApiKey.SYNC_GROUP,
                5,
                group_id=group,
                generation_id=1,
                member_id="m",
                protocol_type=None,
                protocol_name="range",
            )
        )
        assert resp.error_code == INCONSISTENT_GROUP_PROTOCOL


def test_leave_unknown_group(gb: Broker, group: str) -> None:
    with WireClient(gb.bootstrap) as c:
        assert (
            c.send(req(ApiKey.LEAVE_GROUP, 1, group_id=group, member_id="m")).error_code == UNKNOWN_MEMBER_ID
        )
        lm = mod(ApiKey.LEAVE_GROUP, 4)
        resp = c.send(
            req(ApiKey.LEAVE_GROUP, 4, group_id=group, members=(build(lm.MemberIdentity, member_id="m"),))
        )
        assert resp.error_code == NONE
        assert [(m.member_id, m.error_code) for m in resp.members] == [("m", UNKNOWN_MEMBER_ID)]


def test_offset_commit_unknown_partitions(gb: Broker, topic: str, group: str) -> None:
    create_topic(gb.bootstrap, topic, partitions=1)
    cm = mod(ApiKey.OFFSET_COMMIT, 8)

    def part(i: int) -> Any:
        return build(
            cm.OffsetCommitRequestPartition, partition_index=i, committed_offset=5, committed_leader_epoch=-1
        )

    with WireClient(gb.bootstrap) as c:
        resp = c.send(
            req(
                ApiKey.OFFSET_COMMIT,
                8,
                group_id=group,
                generation_id_or_member_epoch=-1,
                member_id="",
                topics=(
                    build(cm.OffsetCommitRequestTopic, name=topic, partitions=(part(0), part(3))),
                    build(cm.OffsetCommitRequestTopic, name=topic + "-missing", partitions=(part(0),)),
                ),
            )
        )
        got = [(t.name, p.partition_index, p.error_code) for t in resp.topics for p in t.partitions]
        assert got == [
            (topic, 0, NONE),
            (topic, 3, UNKNOWN_TOPIC_OR_PARTITION),
            (topic + "-missing", 0, UNKNOWN_TOPIC_OR_PARTITION),
        ]
        # a simple (generation -1) commit creates an Empty group with the offset
        assert _offset_fetch(c, 8, group, topic) == [(topic, 0, 5, "", NONE)]
        # a generation given for a group that has none
        resp = c.send(
            req(
                ApiKey.OFFSET_COMMIT,
                8,
                group_id=group,
                generation_id_or_member_epoch=3,
                member_id="m",
                topics=(build(cm.OffsetCommitRequestTopic, name=topic, partitions=(part(0),)),),
            )
        )
        assert resp.topics[0].partitions[0].error_code == UNKNOWN_MEMBER_ID


def test_rebalance_of_two_wire_members(gb: Broker, group: str) -> None:
    """A second member's JoinGroup parks until the first re-joins (its heartbeat learns of the
    rebalance); both then get generation 2."""
    import threading

    with WireClient(gb.bootstrap) as a, WireClient(gb.bootstrap) as b:
        first = join(a, 9, group)
        a_id = join(a, 9, group, member_id=first.member_id).member_id
        c_sync = a.send(
            req(
                ApiKey.SYNC_GROUP,
                5,
                group_id=group,
                generation_id=1,
                member_id=a_id,
                protocol_type="consumer",
                protocol_name="range",
                assignments=(),
            )
        )
        assert c_sync.error_code == NONE
        b_id = join(b, 9, group).member_id
        result: list[Any] = []
        t = threading.Thread(target=lambda: result.append(join(b, 9, group, member_id=b_id)))
        t.start()
        t.join(0.3)
        assert t.is_alive(), "the new member's JoinGroup must wait for the rebalance"
        assert (
            a.send(req(ApiKey.HEARTBEAT, 4, group_id=group, generation_id=1, member_id=a_id)).error_code
            == REBALANCE_IN_PROGRESS
        )
        rejoined = join(a, 9, group, member_id=a_id)
        t.join(5)
        assert not t.is_alive()
        (b_joined,) = result
        assert rejoined.error_code == NONE and b_joined.error_code == NONE
        assert int(rejoined.generation_id) == int(b_joined.generation_id) == 2
        assert rejoined.leader == a_id and sorted(m.member_id for m in rejoined.members) == sorted(
            [a_id, b_id]
        )
        assert b_joined.members == ()
