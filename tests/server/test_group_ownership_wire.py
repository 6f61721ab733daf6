"""The group coordinator's own ownership answer (``GroupCoordinator.owner_error``) reaches the
wire in each group API's shape: an in-process broker whose coordinator loaded only other
``__consumer_offsets`` partitions, so that the handlers' early check passes (a single broker's
runtime owns every partition) and the coordinator refuses when the request runs -- as on a
cluster broker whose request waited for the operation lock behind a resigning reload. Every
error field of the answer must be NOT_COORDINATOR; OffsetFetch must never answer offsets (v1, which
has no group-level error, repeats it per requested partition as Kafka does)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from tests.server.authz_broker import ADMIN, AuthzBroker, error_codes
from tests.server.test_authorization_matrix import CASES, GROUP, TOPIC, Case

from exactly.protocol.apis import ApiKey, build
from exactly.server.clock import now_ms

pytestmark = pytest.mark.timeout(60)

GROUP_APIS = {
    ApiKey.JOIN_GROUP,
    ApiKey.SYNC_GROUP,
    ApiKey.HEARTBEAT,
    ApiKey.LEAVE_GROUP,
    ApiKey.OFFSET_COMMIT,
    ApiKey.TXN_OFFSET_COMMIT,
    ApiKey.OFFSET_FETCH,
    ApiKey.DESCRIBE_GROUPS,
    ApiKey.DELETE_GROUPS,
}
GROUP_CASES = [c for c in CASES if c.api in GROUP_APIS]


def run(scenario: Any) -> Any:
    async def main() -> Any:
        ab = await AuthzBroker().open({TOPIC: 1})
        try:
            assert ab.broker is not None
            groups = ab.broker.groups
            coordinator = groups.coordinator
            # The coordinator owns one partition, not the one of GROUP; the handlers' check passes.
            mine = next(
                g
                for g in (f"mine-{i}" for i in range(100))
                if coordinator.partition_for(g) != coordinator.partition_for(GROUP)
            )
            groups.runtime.drive(coordinator.unload(now_ms()))
            coordinator.begin_load([coordinator.partition_for(mine)])
            groups.runtime.drive(coordinator.load_complete(now_ms()))
            assert groups.load_error_for(GROUP) == ErrorCode.none
            return await scenario(ab, mine)
        finally:
            await ab.close()

    return asyncio.run(main())


def test_every_group_api_is_in_the_cases() -> None:
    assert {c.api for c in GROUP_CASES} == GROUP_APIS


@pytest.mark.parametrize("case", GROUP_CASES, ids=str)
def test_a_group_the_coordinator_does_not_own_gets_not_coordinator(case: Case) -> None:
    async def scenario(ab: AuthzBroker, _mine: str) -> None:
        response = await ab.call(
            ADMIN, case.api, case.version, **case.fields(ab.module(case.api, case.version))
        )
        codes = error_codes(response)
        assert codes and set(codes) == {int(ErrorCode.not_coordinator)}, response

    run(scenario)


def test_offset_fetch_v1_repeats_the_error_per_partition_and_v8_answers_each_group() -> None:
    async def scenario(ab: AuthzBroker, mine: str) -> None:
        m1 = ab.module(ApiKey.OFFSET_FETCH, 1)
        v1 = await ab.call(
            ADMIN,
            ApiKey.OFFSET_FETCH,
            1,
            group_id=GROUP,
            topics=(build(m1.OffsetFetchRequestTopic, name=TOPIC, partition_indexes=(0, 1)),),
        )
        [topic] = v1.topics
        assert [(p.partition_index, p.committed_offset, p.error_code) for p in topic.partitions] == [
            (0, -1, ErrorCode.not_coordinator),
            (1, -1, ErrorCode.not_coordinator),
        ]
        m8 = ab.module(ApiKey.OFFSET_FETCH, 8)
        topics = (build(m8.OffsetFetchRequestTopics, name=TOPIC, partition_indexes=(0,)),)
        v8 = await ab.call(
            ADMIN,
            ApiKey.OFFSET_FETCH,
            8,
            groups=tuple(build(m8.OffsetFetchRequestGroup, group_id=g, topics=topics) for g in (GROUP, mine)),
            require_stable=False,
        )
        theirs, ours = v8.groups
        assert (theirs.group_id, theirs.error_code, theirs.topics) == (GROUP, ErrorCode.not_coordinator, ())
        assert (ours.group_id, ours.error_code) == (mine, ErrorCode.none)
        assert [p.committed_offset for t in ours.topics for p in t.partitions] == [-1]

    run(scenario)
