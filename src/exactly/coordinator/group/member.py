"""One member of a classic group (Kafka's ``ClassicGroupMember``).

A member is soft state: it exists only while the member keeps heartbeating; its durable trace is the
``MemberMetadata`` entry of the group's last ``GroupMetadataValue`` record. It holds the parked
JoinGroup/SyncGroup reply callbacks: ``awaiting_join`` is set while the member's JoinGroup waits for the
rebalance to finish, ``awaiting_sync`` while a follower's SyncGroup waits for the leader's assignment.

Invariants: ``protocols`` is non-empty and in the member's preference order; ``is_new`` is true from the
first successful join until the first join phase that includes it completes (new members may be
expired even while their JoinGroup is parked, so an abandoned JoinGroup cannot hold a rebalance open).
"""

from __future__ import annotations

from collections.abc import Callable

from exactly.coordinator.group.api import (
    DescribedMember,
    JoinGroupResponseData,
    Protocol,
    SyncGroupResponseData,
)

JoinReply = Callable[[JoinGroupResponseData], None]
SyncReply = Callable[[SyncGroupResponseData], None]


class GroupMember:
    """Mutable membership record; the group owns it and keeps the join-awaiting count in step.

    Owns the member's protocols, timeouts, assignment and its parked JoinGroup/SyncGroup replies.
    Lifecycle: added by a join (or by replay of its group's record), removed when it leaves, its
    session expires, it is fenced by a newer static instance, or its group goes.
    """

    __slots__ = (
        "assignment",
        "awaiting_join",
        "awaiting_sync",
        "client_host",
        "client_id",
        "group_instance_id",
        "is_new",
        "member_id",
        "protocol_type",
        "protocols",
        "rebalance_timeout_ms",
        "session_timeout_ms",
    )

    def __init__(
        self,
        *,
        member_id: str,
        group_instance_id: str | None,
        client_id: str,
        client_host: str,
        rebalance_timeout_ms: int,
        session_timeout_ms: int,
        protocol_type: str,
        protocols: tuple[Protocol, ...],
        assignment: bytes = b"",
    ) -> None:
        self.member_id = member_id
        self.group_instance_id = group_instance_id
        self.client_id = client_id
        self.client_host = client_host
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.session_timeout_ms = session_timeout_ms
        self.protocol_type = protocol_type
        self.protocols = protocols
        self.assignment = assignment
        self.awaiting_join: JoinReply | None = None
        self.awaiting_sync: SyncReply | None = None
        self.is_new = False

    @property
    def is_static(self) -> bool:
        return self.group_instance_id is not None

    @property
    def is_awaiting_join(self) -> bool:
        return self.awaiting_join is not None

    @property
    def is_awaiting_sync(self) -> bool:
        return self.awaiting_sync is not None

    def protocol_names(self) -> set[str]:
        return {p.name for p in self.protocols}

    def metadata(self, protocol_name: str | None) -> bytes:
        """The member's metadata for ``protocol_name``; raises if it does not support it."""
        for p in self.protocols:
            if p.name == protocol_name:
                return p.metadata
        raise KeyError(f"member {self.member_id} does not support protocol {protocol_name}")

    def matches(self, protocols: tuple[Protocol, ...]) -> bool:
        """Same protocols, same metadata, same order: a JoinGroup that changes nothing."""
        return self.protocols == protocols

    def vote(self, candidates: set[str]) -> str:
        """The member's most preferred protocol among ``candidates``."""
        for p in self.protocols:
            if p.name in candidates:
                return p.name
        raise ValueError(f"member {self.member_id} supports none of {sorted(candidates)}")

    def has_satisfied_heartbeat(self) -> bool:
        """Whether a fired session timer should spare this member.

        New members can expire even while parked in JoinGroup; others awaiting a join or sync
        response are waiting on the coordinator, not failing to heartbeat.
        """
        if self.is_new:
            return False
        return self.is_awaiting_join or self.is_awaiting_sync

    def describe(self, protocol_name: str | None, with_metadata: bool) -> DescribedMember:
        return DescribedMember(
            member_id=self.member_id,
            group_instance_id=self.group_instance_id,
            client_id=self.client_id,
            client_host=self.client_host,
            member_metadata=self.metadata(protocol_name) if with_metadata else b"",
            member_assignment=self.assignment if with_metadata else b"",
        )
