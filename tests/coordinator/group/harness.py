"""A fake runtime for the sans-IO group coordinator: an in-memory ``__consumer_offsets`` log.

``Shell.run(result)`` delivers the result's replies (a request's token is the :class:`Box` that
collects its answers), appends each write's records to the log (assigning offsets) and completes
it, handling the completions' results the same way. ``hold=True`` keeps writes un-completed so a
test can check that nothing is visible before the append finishes. ``rebuild()`` replays the log
into a fresh coordinator: the recovery path.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from exactly.coordinator.group.api import (
    HeartbeatRequestData,
    JoinGroupRequestData,
    JoinGroupResponseData,
    Protocol,
    SyncGroupAssignment,
    SyncGroupRequestData,
    SyncGroupResponseData,
)
from exactly.coordinator.group.coordinator import GroupCoordinator, GroupCoordinatorConfig
from exactly.coordinator.result import AppendOutcome, CoordinatorResult, Write

GROUP = "g1"
SESSION = 10_000
REBALANCE = 30_000


@dataclass
class LogEntry:
    offset: int
    key: bytes | None  # None for a control marker
    value: bytes | None
    producer_id: int = -1
    commit: bool | None = None  # marker type


@dataclass(eq=False)
class Box:
    """A request's token: collects the replies addressed to it (hashable by identity)."""

    items: list[Any] = field(default_factory=list)

    def __call__(self, response: Any) -> None:
        self.items.append(response)

    @property
    def one(self) -> Any:
        assert len(self.items) == 1, self.items
        return self.items[0]

    @property
    def last(self) -> Any:
        assert self.items
        return self.items[-1]


class Shell:
    def __init__(self, config: GroupCoordinatorConfig | None = None) -> None:
        self.config = config or GroupCoordinatorConfig(initial_rebalance_delay_ms=0)
        counter = itertools.count(1)
        self.coordinator = GroupCoordinator(self.config, member_id_factory=lambda p: f"{p}-m{next(counter)}")
        self.log: dict[int, list[LogEntry]] = {}
        self.now = 1_000
        self.held: list[Write] = []
        self.fail_with: ErrorCode | None = None

    # -- plumbing ------------------------------------------------------------------------------

    def run(self, result: CoordinatorResult[Any], *, hold: bool = False) -> None:
        self.deliver(result)
        if hold:
            self.held.extend(result.writes)
            return
        queue = list(result.writes)
        while queue:
            write = queue.pop(0)
            done = self.complete(write)
            self.deliver(done)
            queue.extend(done.writes)

    @staticmethod
    def deliver(result: CoordinatorResult[Any]) -> None:
        assert result.response is None and not result.effects  # groups answer by token only
        for reply in result.replies:
            reply.token(reply.response)

    def complete(self, write: Write) -> CoordinatorResult[Any]:
        if self.fail_with is not None:
            return write.complete(AppendOutcome(now_ms=self.now, error=self.fail_with))
        entries = self.log.setdefault(write.partition, [])
        base = len(entries)
        for i, (key, value) in enumerate(write.records):
            entries.append(LogEntry(base + i, key, value, write.producer_id))
        return write.complete(AppendOutcome(now_ms=self.now, base_offset=base))

    def release(self) -> None:
        held, self.held = self.held, []
        self.run(CoordinatorResult(writes=tuple(held)))

    def marker(self, producer_id: int, commit: bool, partition: int) -> None:
        entries = self.log.setdefault(partition, [])
        entries.append(LogEntry(len(entries), None, None, producer_id, commit))
        self.coordinator.complete_transaction(producer_id, commit, partition)

    def advance(self, ms: int) -> None:
        self.now += ms
        self.run(self.coordinator.poll(self.now))

    def rebuild(self) -> GroupCoordinator:
        fresh = GroupCoordinator(self.config)
        for partition in sorted(self.log):
            for e in self.log[partition]:
                if e.key is None:
                    assert e.commit is not None
                    fresh.replay_end_transaction(e.producer_id, e.commit, partition)
                else:
                    fresh.replay(e.key, e.value, offset=e.offset, producer_id=e.producer_id)
        return fresh

    # -- client actions ------------------------------------------------------------------------

    def join(
        self,
        member_id: str = "",
        *,
        group: str = GROUP,
        instance: str | None = None,
        protocols: tuple[Protocol, ...] = (Protocol("range", b"sub-a"),),
        version: int = 9,
        client_id: str = "c",
        session: int = SESSION,
        rebalance: int = REBALANCE,
        hold: bool = False,
    ) -> Box:
        box = Box()
        request = JoinGroupRequestData(
            group_id=group,
            session_timeout_ms=session,
            rebalance_timeout_ms=rebalance,
            member_id=member_id,
            group_instance_id=instance,
            protocol_type="consumer",
            protocols=protocols,
            api_version=version,
            client_id=client_id,
            client_host="/127.0.0.1",
        )
        self.run(self.coordinator.join_group(request, self.now, box), hold=hold)
        return box

    def join_fully(self, **kwargs: Any) -> Box:
        """JoinGroup v4+ handshake: MEMBER_ID_REQUIRED, then join with the handed-out id."""
        first = self.join(**kwargs).one
        assert first.error_code == ErrorCode.member_id_required
        return self.join(first.member_id, **kwargs)

    def sync(
        self,
        member_id: str,
        generation: int,
        assignments: dict[str, bytes] | None = None,
        *,
        group: str = GROUP,
        instance: str | None = None,
        hold: bool = False,
    ) -> Box:
        box = Box()
        request = SyncGroupRequestData(
            group_id=group,
            generation_id=generation,
            member_id=member_id,
            group_instance_id=instance,
            protocol_type="consumer",
            assignments=tuple(SyncGroupAssignment(m, a) for m, a in (assignments or {}).items()),
        )
        self.run(self.coordinator.sync_group(request, self.now, box), hold=hold)
        return box

    def heartbeat(
        self, member_id: str, generation: int, *, group: str = GROUP, instance: str | None = None
    ) -> ErrorCode:
        box = Box()
        request = HeartbeatRequestData(
            group_id=group, generation_id=generation, member_id=member_id, group_instance_id=instance
        )
        self.run(self.coordinator.heartbeat(request, self.now, box))
        code: ErrorCode = box.one.error_code
        return code

    def stable_single(self, **kwargs: Any) -> tuple[str, int]:
        """One member joins and syncs; returns (member id, generation)."""
        joined: JoinGroupResponseData = self.join_fully(**kwargs).one
        assert joined.error_code == ErrorCode.none
        synced: SyncGroupResponseData = self.sync(
            joined.member_id, joined.generation_id, {joined.member_id: b"assign-1"}
        ).one
        assert synced.error_code == ErrorCode.none
        return joined.member_id, joined.generation_id
