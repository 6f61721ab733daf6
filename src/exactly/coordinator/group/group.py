"""Metadata of one classic group (Kafka's ``ClassicGroup``), without timers or I/O.

The group holds membership (dynamic members by member id, static members also by
``group.instance.id``), the generation, the selected protocol and the leader. The coordinator drives it;
this class only keeps its own invariants:

- ``members`` keeps insertion order, so leader re-election (first remaining member) and protocol
  tie-breaks are deterministic.
- ``num_awaiting_join`` equals the number of members whose JoinGroup is parked.
- ``supported`` counts, per protocol name, how many members support it; a protocol is a candidate
  when every member supports it.
- ``pending_join`` holds member ids handed out with MEMBER_ID_REQUIRED that have not joined yet
  (KIP-394); they count as "not joined" so a rebalance waits for them.
- ``pending_sync`` holds members of the current generation that have not sent SyncGroup yet.
- every state change goes through :meth:`transition_to` and the table in ``state.py``.
"""

from __future__ import annotations

from collections import Counter

from kio.schema.errors import ErrorCode

from exactly.coordinator.group.api import (
    DescribedGroup,
    JoinGroupMember,
    JoinGroupResponseData,
    ListedGroup,
    Protocol,
    SyncGroupResponseData,
)
from exactly.coordinator.group.member import GroupMember, JoinReply
from exactly.coordinator.group.records import GroupMetadataValue, MemberMetadata
from exactly.coordinator.group.state import GroupState, check_transition

CONSUMER_PROTOCOL_TYPE = "consumer"


class ClassicGroup:
    """One classic group; see the module docstring for the invariants it keeps.

    Owns its members, generation, protocol and leader. Lifecycle: created by a first JoinGroup, by
    replay of its group record, or as a "simple" group by its first offset; lives in
    ``Membership.groups`` until a tombstone (DeleteGroups, retention) or a newer group record
    replaces it -- code holding a reference checks it is still the current object.
    """

    def __init__(
        self,
        group_id: str,
        *,
        state: GroupState = GroupState.EMPTY,
        now_ms: int = -1,
        generation: int = 0,
        protocol_type: str | None = None,
        protocol_name: str | None = None,
        leader_id: str | None = None,
    ) -> None:
        self.group_id = group_id
        self.state = state
        self.previous_state = GroupState.DEAD
        self.state_timestamp_ms = now_ms
        self.generation = generation
        self.protocol_type = protocol_type
        self.protocol_name = protocol_name
        self.leader_id = leader_id
        self.members: dict[str, GroupMember] = {}
        self.static_members: dict[str, str] = {}
        self.pending_join: set[str] = set()
        self.pending_sync: set[str] = set()
        self.num_awaiting_join = 0
        self.supported: Counter[str] = Counter()
        self.new_member_added = False

    # -- state ----------------------------------------------------------------------------------

    def is_in(self, *states: GroupState) -> bool:
        return self.state in states

    def transition_to(self, target: GroupState, now_ms: int) -> None:
        check_transition(self.state, target)
        self.previous_state = self.state
        self.state = target
        self.state_timestamp_ms = now_ms

    def can_rebalance(self) -> bool:
        return self.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY)

    # -- membership -----------------------------------------------------------------------------

    def has_member(self, member_id: str) -> bool:
        return member_id in self.members

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id is not None and self.leader_id == member_id

    def add(self, member: GroupMember, reply: JoinReply | None = None) -> None:
        if member.group_instance_id is not None:
            if member.group_instance_id in self.static_members:
                raise RuntimeError(f"static member {member.group_instance_id} is already in the group")
            self.static_members[member.group_instance_id] = member.member_id
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.protocol_type != member.protocol_type:
            raise RuntimeError("the group's and the member's protocol types differ")
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        self.supported.update(member.protocol_names())
        member.awaiting_join = reply
        if reply is not None:
            self.num_awaiting_join += 1
        self.pending_join.discard(member.member_id)

    def remove(self, member_id: str) -> None:
        member = self.members.pop(member_id, None)
        if member is not None:
            self.supported.subtract(member.protocol_names())
            if member.is_awaiting_join:
                self.num_awaiting_join -= 1
            if member.group_instance_id is not None:
                self.static_members.pop(member.group_instance_id, None)
        if self.is_leader(member_id):
            self.leader_id = next(iter(self.members), None)
        self.pending_join.discard(member_id)
        self.pending_sync.discard(member_id)

    def update_member(
        self,
        member: GroupMember,
        *,
        protocols: tuple[Protocol, ...],
        rebalance_timeout_ms: int,
        session_timeout_ms: int,
        reply: JoinReply | None,
    ) -> None:
        self.supported.subtract(member.protocol_names())
        member.protocols = protocols
        self.supported.update(member.protocol_names())
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms
        if reply is not None and not member.is_awaiting_join:
            self.num_awaiting_join += 1
        elif reply is None and member.is_awaiting_join:
            self.num_awaiting_join -= 1
        member.awaiting_join = reply

    def replace_static_member(self, instance_id: str, old_member_id: str, new_member_id: str) -> GroupMember:
        """Give a restarted static member a new member id, keeping everything else (KIP-345).

        A parked JoinGroup/SyncGroup of the old id is answered FENCED_INSTANCE_ID at once: the old
        process (if it still lives) must not get the new generation's data.
        """
        old = self.members.pop(old_member_id)
        if old.awaiting_join is not None:
            reply = old.awaiting_join
            old.awaiting_join = None
            self.num_awaiting_join -= 1
            reply(JoinGroupResponseData(error_code=ErrorCode.fenced_instance_id, member_id=old_member_id))
        if old.awaiting_sync is not None:
            sync_reply = old.awaiting_sync
            old.awaiting_sync = None
            sync_reply(SyncGroupResponseData(error_code=ErrorCode.fenced_instance_id))
        new = GroupMember(
            member_id=new_member_id,
            group_instance_id=old.group_instance_id,
            client_id=old.client_id,
            client_host=old.client_host,
            rebalance_timeout_ms=old.rebalance_timeout_ms,
            session_timeout_ms=old.session_timeout_ms,
            protocol_type=old.protocol_type,
            protocols=old.protocols,
            assignment=old.assignment,
        )
        self.members[new_member_id] = new
        if self.is_leader(old_member_id):
            self.leader_id = new_member_id
        self.static_members[instance_id] = new_member_id
        self.pending_sync.discard(old_member_id)
        return new

    def validate_member(self, member_id: str, group_instance_id: str | None) -> ErrorCode:
        """UNKNOWN_MEMBER_ID / FENCED_INSTANCE_ID unless the (member id, instance id) pair is current."""
        if group_instance_id is not None:
            existing = self.static_members.get(group_instance_id)
            if existing is None:
                return ErrorCode.unknown_member_id
            if existing != member_id:
                return ErrorCode.fenced_instance_id
        if member_id not in self.members:
            return ErrorCode.unknown_member_id
        return ErrorCode.none

    def complete_join(self, member: GroupMember, response: JoinGroupResponseData) -> bool:
        """Answer the member's parked JoinGroup, if any; keeps ``num_awaiting_join`` in step."""
        reply = member.awaiting_join
        if reply is None:
            return False
        member.awaiting_join = None
        self.num_awaiting_join -= 1
        reply(response)
        return True

    def complete_sync(self, member: GroupMember, response: SyncGroupResponseData) -> bool:
        """Answer the member's parked SyncGroup, if any."""
        reply = member.awaiting_sync
        if reply is None:
            return False
        member.awaiting_sync = None
        reply(response)
        return True

    def has_all_members_joined(self) -> bool:
        return len(self.members) == self.num_awaiting_join and not self.pending_join

    def not_yet_rejoined(self) -> list[GroupMember]:
        return [m for m in self.members.values() if not m.is_awaiting_join]

    def rebalance_timeout_ms(self) -> int:
        """The group's rebalance timeout: the largest of its members'."""
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def maybe_elect_new_joined_leader(self) -> bool:
        """Keep the leader if it re-joined, else pick a joined member; False if nobody joined."""
        if self.leader_id is None:
            return False
        leader = self.members.get(self.leader_id)
        if leader is not None and leader.is_awaiting_join:
            return True
        for member in self.members.values():
            if member.is_awaiting_join:
                self.leader_id = member.member_id
                return True
        return False

    # -- protocols ------------------------------------------------------------------------------

    def candidate_protocols(self) -> set[str]:
        n = len(self.members)
        return {name for name, count in self.supported.items() if count == n and n > 0}

    def supports_protocols(self, protocol_type: str, names: set[str]) -> bool:
        """Can a member with these protocols join? (Empty group: any non-empty type and list.)"""
        if self.state is GroupState.EMPTY:
            return bool(protocol_type) and bool(names)
        n = len(self.members)
        return self.protocol_type == protocol_type and any(self.supported[name] == n for name in names)

    def select_protocol(self) -> str:
        """Each member votes for its preferred candidate; most votes wins (first-seen on ties)."""
        if not self.members:
            raise RuntimeError("cannot select a protocol for an empty group")
        candidates = self.candidate_protocols()
        votes: Counter[str] = Counter(m.vote(candidates) for m in self.members.values())
        return max(votes, key=lambda name: votes[name])

    def init_next_generation(self, now_ms: int) -> None:
        self.generation += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.transition_to(GroupState.COMPLETING_REBALANCE, now_ms)
        else:
            self.protocol_name = None
            self.transition_to(GroupState.EMPTY, now_ms)
        self.pending_sync.clear()

    # -- views ----------------------------------------------------------------------------------

    def join_members(self) -> tuple[JoinGroupMember, ...]:
        """The member list the leader receives (metadata for the selected protocol)."""
        return tuple(
            JoinGroupMember(m.member_id, m.group_instance_id, m.metadata(self.protocol_name))
            for m in self.members.values()
        )

    def describe(self) -> DescribedGroup:
        stable = self.state is GroupState.STABLE
        return DescribedGroup(
            group_id=self.group_id,
            group_state=self.state.wire_name,
            protocol_type=self.protocol_type or "",
            protocol_data=(self.protocol_name or "") if stable else "",
            members=tuple(m.describe(self.protocol_name, stable) for m in self.members.values()),
        )

    def listed(self) -> ListedGroup:
        return ListedGroup(self.group_id, self.protocol_type or "", self.state.wire_name)

    def to_record(self, assignment: dict[str, bytes]) -> GroupMetadataValue:
        """The GroupMetadataValue Kafka writes for this group with ``assignment``."""
        members = tuple(
            MemberMetadata(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                rebalance_timeout=m.rebalance_timeout_ms,
                session_timeout=m.session_timeout_ms,
                subscription=m.metadata(self.protocol_name),
                assignment=assignment.get(m.member_id, b""),
            )
            for m in self.members.values()
        )
        return GroupMetadataValue(
            protocol_type=self.protocol_type or "",
            generation=self.generation,
            protocol=self.protocol_name,
            leader=self.leader_id,
            current_state_timestamp=self.state_timestamp_ms,
            members=members,
        )

    @classmethod
    def from_record(cls, group_id: str, value: GroupMetadataValue) -> ClassicGroup:
        """Rebuild a group from its last record: Stable with its members, or Empty."""
        group = cls(
            group_id,
            state=GroupState.STABLE if value.members else GroupState.EMPTY,
            now_ms=value.current_state_timestamp,
            generation=value.generation,
            protocol_type=value.protocol_type or None,
            protocol_name=value.protocol,
            leader_id=value.leader,
        )
        for m in value.members:
            group.add(
                GroupMember(
                    member_id=m.member_id,
                    group_instance_id=m.group_instance_id,
                    client_id=m.client_id,
                    client_host=m.client_host,
                    rebalance_timeout_ms=m.session_timeout
                    if m.rebalance_timeout == -1
                    else m.rebalance_timeout,
                    session_timeout_ms=m.session_timeout,
                    protocol_type=value.protocol_type,
                    protocols=(Protocol(value.protocol or "", m.subscription),),
                    assignment=m.assignment,
                )
            )
        return group
