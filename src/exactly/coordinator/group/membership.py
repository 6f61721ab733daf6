"""JoinGroup, SyncGroup, Heartbeat, LeaveGroup and the rebalance protocol of classic groups.

Theory of operation (Kafka's ``GroupMetadataManager`` classic paths)
------------------------------------------------------------------
A rebalance starts when a member joins, changes its protocols, leaves, fails its session, or the
leader re-joins. The group moves to PreparingRebalance and parks every JoinGroup until all known
members re-joined (or the group's rebalance timeout -- the largest member's -- fires; dynamic members
that did not re-join by then are removed). Then the generation is bumped, a protocol every member
supports is chosen by vote, the leader gets the member list, and the group waits in
CompletingRebalance for the leader's SyncGroup. The leader's assignment is appended to
``__consumer_offsets`` (a GroupMetadataValue); only when that append completes do the parked
followers' SyncGroup requests get their assignments and the group becomes Stable.

Timers are the rebalancer's (``rebalance.py``).

Static members (KIP-345): a member with ``group.instance.id`` that restarts joins with an empty member
id; it takes over its old entry under a new member id (the old id is fenced), and if the group is
Stable and the selected protocol would not change, no rebalance happens -- after the group record
with the new id is persisted it gets the current generation and its previous assignment back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Never

from kio.schema.errors import ErrorCode

from exactly.coordinator.group.api import (
    HeartbeatRequestData,
    HeartbeatResponseData,
    JoinGroupRequestData,
    JoinGroupResponseData,
    LeaveGroupRequestData,
    LeaveGroupResponseData,
    LeaveMemberResponse,
    SyncGroupRequestData,
    SyncGroupResponseData,
)
from exactly.coordinator.group.core import GroupCoordinatorConfig, Operations
from exactly.coordinator.group.group import ClassicGroup
from exactly.coordinator.group.member import GroupMember, JoinReply, SyncReply
from exactly.coordinator.group.offsets import map_append_error
from exactly.coordinator.group.rebalance import Rebalancer
from exactly.coordinator.group.records import GroupMetadataValue
from exactly.coordinator.group.state import GroupState
from exactly.coordinator.result import AppendOutcome, CoordinatorResult, RequestToken

_S = GroupState


class Membership:
    """The classic groups and their members: JoinGroup, SyncGroup, Heartbeat, LeaveGroup.

    Owns ``groups`` -- every group this coordinator knows, by id; the other parts read it and
    change it only through :meth:`ensure_group`, :meth:`load_group` and :meth:`unload_group`.
    Created empty with its coordinator, filled by replay, lives as long as the coordinator.
    """

    def __init__(
        self,
        config: GroupCoordinatorConfig,
        ops: Operations,
        member_id_factory: Callable[[str], str],
    ) -> None:
        self.config = config
        self.groups: dict[str, ClassicGroup] = {}
        self.rebalance = Rebalancer(config, ops, self.groups)
        self._ops = ops
        self._new_member_id = member_id_factory

    # -- the groups -----------------------------------------------------------------------------

    def is_current(self, group: ClassicGroup) -> bool:
        return self.groups.get(group.group_id) is group

    def ensure_group(self, group_id: str) -> ClassicGroup:
        """The group, created as a "simple" Empty group (offsets only) if unknown, as Kafka does."""
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = ClassicGroup(group_id)
        return group

    def load_group(self, group_id: str, value: GroupMetadataValue) -> None:
        """Apply a group record: the group as persisted replaces whatever was in memory."""
        self.unload_group(group_id)
        self.groups[group_id] = ClassicGroup.from_record(group_id, value)

    def unload_group(self, group_id: str) -> ClassicGroup | None:
        """Forget a group and its timers (tombstone applied, or replaced by a newer record)."""
        existing = self.groups.pop(group_id, None)
        if existing is not None:
            self.rebalance.cancel_all(existing)
        return existing

    def unload_all(self) -> None:
        """Stop owning every group: answer parked JoinGroup/SyncGroup requests NOT_COORDINATOR
        (the client finds the new coordinator) and forget the groups and their timers."""
        for group in list(self.groups.values()):
            for member in group.members.values():
                group.complete_join(member, JoinGroupResponseData(error_code=ErrorCode.not_coordinator))
                group.complete_sync(member, SyncGroupResponseData(error_code=ErrorCode.not_coordinator))
            self.unload_group(group.group_id)

    def start_sessions(self) -> None:
        """After loading: every loaded member must heartbeat within its session again."""
        for group in self.groups.values():
            for member in group.members.values():
                self.rebalance.schedule_heartbeat(group, member)

    # -- public API -----------------------------------------------------------------------------

    def join_group(
        self, request: JoinGroupRequestData, now_ms: int, token: RequestToken
    ) -> CoordinatorResult[Never]:
        """JoinGroup v0-v9; answered when the join phase completes (maybe much later)."""
        return self._ops.run(now_ms, lambda: self._join(request, self._ops.deferred(token)))

    def sync_group(
        self, request: SyncGroupRequestData, now_ms: int, token: RequestToken
    ) -> CoordinatorResult[Never]:
        """SyncGroup; followers' replies wait until the leader's assignment is persisted."""
        return self._ops.run(now_ms, lambda: self._sync(request, self._ops.deferred(token)))

    def heartbeat(
        self, request: HeartbeatRequestData, now_ms: int, token: RequestToken
    ) -> CoordinatorResult[Never]:
        """Heartbeat; answered at once (writes come only from timers that were due)."""
        return self._ops.run(now_ms, lambda: self._ops.reply(token, self._heartbeat(request)))

    def leave_group(
        self, request: LeaveGroupRequestData, now_ms: int, token: RequestToken
    ) -> CoordinatorResult[Never]:
        """LeaveGroup (batched since v3); answered at once."""
        return self._ops.run(now_ms, lambda: self._ops.reply(token, self._leave(request)))

    # -- JoinGroup ------------------------------------------------------------------------------

    def _join(self, req: JoinGroupRequestData, reply: JoinReply) -> None:
        if not req.group_id:
            reply(JoinGroupResponseData(error_code=ErrorCode.invalid_group_id, member_id=req.member_id))
            return
        cfg = self.config
        if not cfg.min_session_timeout_ms <= req.session_timeout_ms <= cfg.max_session_timeout_ms:
            reply(
                JoinGroupResponseData(error_code=ErrorCode.invalid_session_timeout, member_id=req.member_id)
            )
            return
        unknown_member = req.member_id == ""
        group = self.groups.get(req.group_id)
        is_new_group = group is None
        if group is None:
            if not unknown_member:
                reply(JoinGroupResponseData(error_code=ErrorCode.unknown_member_id, member_id=req.member_id))
                return
            group = ClassicGroup(req.group_id, now_ms=self._ops.now)
            self.groups[req.group_id] = group
        effects_before = self._ops.write_count
        if not self._accept_joining_member(group, req.member_id):
            existing = group.members.get(req.member_id)
            if existing is not None:
                self.rebalance.drop_member(group, existing)
            reply(JoinGroupResponseData(error_code=ErrorCode.group_max_size_reached))
        elif unknown_member:
            self._join_new_member(group, req, reply)
        else:
            self._join_existing_member(group, req, reply)
        if is_new_group and self._ops.write_count == effects_before:
            # Like Kafka: a new group is made durable at once with an empty metadata record.
            empty = GroupMetadataValue(
                protocol_type="", generation=0, current_state_timestamp=group.state_timestamp_ms
            )
            self._ops.emit_group_record(group.group_id, empty, lambda result: None)

    def _accept_joining_member(self, group: ClassicGroup, member_id: str) -> bool:
        limit = self.config.max_group_size
        if group.is_in(_S.EMPTY, _S.DEAD):
            return True
        if group.is_in(_S.PREPARING_REBALANCE):
            member = group.members.get(member_id)
            return (member is not None and member.is_awaiting_join) or group.num_awaiting_join < limit
        return group.has_member(member_id) or len(group.members) < limit

    def _join_new_member(self, group: ClassicGroup, req: JoinGroupRequestData, reply: JoinReply) -> None:
        if group.is_in(_S.DEAD):
            reply(JoinGroupResponseData(error_code=ErrorCode.coordinator_not_available))
            return
        if not group.supports_protocols(req.protocol_type, {p.name for p in req.protocols}):
            reply(JoinGroupResponseData(error_code=ErrorCode.inconsistent_group_protocol))
            return
        instance_id = req.group_instance_id
        new_member_id = self._new_member_id(instance_id if instance_id is not None else req.client_id)
        if instance_id is not None:
            existing = group.static_members.get(instance_id)
            if existing is not None:
                self._replace_static_member(group, req, existing, new_member_id, reply)
            else:
                self._add_member_then_rebalance(group, req, new_member_id, reply)
        elif req.api_version >= 4:
            # KIP-394: hand out the id first; the member counts as "not yet joined" until it returns.
            group.pending_join.add(new_member_id)
            self.rebalance.schedule_session(group, new_member_id, req.session_timeout_ms)
            reply(JoinGroupResponseData(error_code=ErrorCode.member_id_required, member_id=new_member_id))
        else:
            self._add_member_then_rebalance(group, req, new_member_id, reply)

    def _join_existing_member(self, group: ClassicGroup, req: JoinGroupRequestData, reply: JoinReply) -> None:
        member_id = req.member_id

        def fail(error: ErrorCode) -> None:
            reply(JoinGroupResponseData(error_code=error, member_id=member_id))

        if group.is_in(_S.DEAD):
            return fail(ErrorCode.coordinator_not_available)
        if not group.supports_protocols(req.protocol_type, {p.name for p in req.protocols}):
            return fail(ErrorCode.inconsistent_group_protocol)
        if member_id in group.pending_join:
            if req.group_instance_id is not None:
                return fail(ErrorCode.unknown_member_id)  # pending ids are only given to dynamic members
            return self._add_member_then_rebalance(group, req, member_id, reply)
        error = group.validate_member(member_id, req.group_instance_id)
        if error is not ErrorCode.none:
            return fail(error)
        member = group.members[member_id]
        if group.is_in(_S.PREPARING_REBALANCE):
            self._update_member_then_rebalance(group, member, req, reply)
        elif group.is_in(_S.COMPLETING_REBALANCE):
            if member.matches(req.protocols):
                # It probably lost the first answer: give it the current generation again.
                reply(self.rebalance.join_response(group, member, with_members=group.is_leader(member_id)))
            else:
                self._update_member_then_rebalance(group, member, req, reply)
        elif group.is_in(_S.STABLE):
            if group.is_leader(member_id) or not member.matches(req.protocols):
                # A leader's JoinGroup forces a rebalance (e.g. topic metadata changed).
                self._update_member_then_rebalance(group, member, req, reply)
            else:
                reply(self.rebalance.join_response(group, member, with_members=False))
        else:
            fail(ErrorCode.unknown_member_id)
        return None

    def _add_member_then_rebalance(
        self, group: ClassicGroup, req: JoinGroupRequestData, member_id: str, reply: JoinReply
    ) -> None:
        member = GroupMember(
            member_id=member_id,
            group_instance_id=req.group_instance_id,
            client_id=req.client_id,
            client_host=req.client_host,
            rebalance_timeout_ms=req.rebalance_timeout_ms,
            session_timeout_ms=req.session_timeout_ms,
            protocol_type=req.protocol_type,
            protocols=req.protocols,
        )
        member.is_new = True
        if group.is_in(_S.PREPARING_REBALANCE) and group.previous_state is _S.EMPTY:
            group.new_member_added = True  # extends the initial rebalance delay
        group.add(member, reply)
        # A parked JoinGroup of a new member cannot heartbeat; bound how long it can hold a rebalance.
        self.rebalance.schedule_heartbeat(group, member, self.config.new_member_join_timeout_ms)
        self.rebalance.maybe_prepare_rebalance_or_complete_join(group)

    def _update_member_then_rebalance(
        self, group: ClassicGroup, member: GroupMember, req: JoinGroupRequestData, reply: JoinReply
    ) -> None:
        self._update_member(group, member, req, reply)
        self.rebalance.maybe_prepare_rebalance_or_complete_join(group)

    def _replace_static_member(
        self, group: ClassicGroup, req: JoinGroupRequestData, old_id: str, new_id: str, reply: JoinReply
    ) -> None:
        instance_id = req.group_instance_id
        assert instance_id is not None
        old_leader = group.leader_id
        member = group.replace_static_member(instance_id, old_id, new_id)
        self.rebalance.cancel_heartbeat(group, old_id)
        self.rebalance.schedule_heartbeat(group, member)
        old_protocols, old_rebalance, old_session = (
            member.protocols,
            member.rebalance_timeout_ms,
            member.session_timeout_ms,
        )
        self._update_member(group, member, req, reply)
        if group.is_in(_S.STABLE):
            if group.protocol_name != group.select_protocol():
                self.rebalance.maybe_prepare_rebalance_or_complete_join(group)
                return
            # No rebalance: persist the new member id, then hand back the current generation.
            generation = group.generation

            def done(result: AppendOutcome) -> None:
                if not self.is_current(group) or group.members.get(new_id) is not member:
                    return
                if result.error is not ErrorCode.none:
                    group.update_member(
                        member,
                        protocols=old_protocols,
                        rebalance_timeout_ms=old_rebalance,
                        session_timeout_ms=old_session,
                        reply=None,
                    )
                    restored = group.replace_static_member(instance_id, new_id, old_id)
                    self.rebalance.cancel_heartbeat(group, new_id)
                    self.rebalance.schedule_heartbeat(group, restored)
                    reply(
                        JoinGroupResponseData(
                            error_code=map_append_error(result.error, offsets=False),
                            generation_id=group.generation,
                            protocol_type=group.protocol_type,
                            protocol_name=group.protocol_name,
                            leader=old_leader or "",
                        )
                    )
                elif group.is_in(_S.STABLE) and group.generation == generation:
                    # v9+ (KIP-814): a static leader keeps its assignment and skips running the assignor.
                    is_leader = group.is_leader(new_id) and req.api_version >= 9
                    response = self.rebalance.join_response(
                        group,
                        member,
                        with_members=is_leader,
                        skip_assignment=is_leader,
                        leader=None if req.api_version >= 9 else old_leader,
                    )
                    group.complete_join(member, response)

            assignment = {m.member_id: m.assignment for m in group.members.values()}
            self._ops.emit_group_record(group.group_id, group.to_record(assignment), done)
        elif group.is_in(_S.COMPLETING_REBALANCE):
            # The leader may already hold the old id in its assignment: rebalance to stay consistent.
            self.rebalance.prepare_rebalance(group)
        elif group.is_in(_S.PREPARING_REBALANCE):
            self.rebalance.maybe_complete_join_phase(group)
        else:
            raise RuntimeError(f"static member re-joined group {group.group_id} in state {group.state}")

    def _update_member(
        self, group: ClassicGroup, member: GroupMember, req: JoinGroupRequestData, reply: JoinReply
    ) -> None:
        """Update protocols/timeouts and park the reply without deciding about a rebalance yet."""
        group.update_member(
            member,
            protocols=req.protocols,
            rebalance_timeout_ms=req.rebalance_timeout_ms,
            session_timeout_ms=req.session_timeout_ms,
            reply=reply,
        )

    # -- SyncGroup ------------------------------------------------------------------------------

    def _sync(self, req: SyncGroupRequestData, reply: SyncReply) -> None:
        def fail(error: ErrorCode) -> None:
            reply(SyncGroupResponseData(error_code=error))

        if not req.group_id:
            return fail(ErrorCode.invalid_group_id)
        group = self.groups.get(req.group_id)
        if group is None:
            return fail(ErrorCode.unknown_member_id)
        if group.is_in(_S.DEAD):
            return fail(ErrorCode.coordinator_not_available)
        error = group.validate_member(req.member_id, req.group_instance_id)
        if error is not ErrorCode.none:
            return fail(error)
        if req.generation_id != group.generation:
            return fail(ErrorCode.illegal_generation)
        if _inconsistent(req.protocol_type, group.protocol_type) or _inconsistent(
            req.protocol_name, group.protocol_name
        ):
            return fail(ErrorCode.inconsistent_group_protocol)
        if group.is_in(_S.EMPTY):
            return fail(ErrorCode.unknown_member_id)
        if group.is_in(_S.PREPARING_REBALANCE):
            return fail(ErrorCode.rebalance_in_progress)
        member = group.members[req.member_id]
        if group.is_in(_S.STABLE):
            self._remove_pending_sync(group, req.member_id)
            reply(
                SyncGroupResponseData(
                    protocol_type=group.protocol_type,
                    protocol_name=group.protocol_name,
                    assignment=member.assignment,
                )
            )
            return None
        # CompletingRebalance: park the reply; the leader's assignment completes everyone.
        member.awaiting_sync = reply
        self._remove_pending_sync(group, req.member_id)
        if group.is_leader(req.member_id):
            assignment = {a.member_id: a.assignment for a in req.assignments}
            for member_id in group.members:
                assignment.setdefault(member_id, b"")
            generation = group.generation

            def done(result: AppendOutcome) -> None:
                if not (
                    self.is_current(group)
                    and group.is_in(_S.COMPLETING_REBALANCE)
                    and group.generation == generation
                ):
                    return
                if result.error is not ErrorCode.none:
                    self.rebalance.propagate_assignment(
                        group, map_append_error(result.error, offsets=False), reset=True
                    )
                    self.rebalance.maybe_prepare_rebalance_or_complete_join(group)
                else:
                    for m in group.members.values():
                        m.assignment = assignment.get(m.member_id, b"")
                    self.rebalance.propagate_assignment(group, ErrorCode.none, reset=False)
                    group.transition_to(_S.STABLE, self._ops.now)

            self._ops.emit_group_record(group.group_id, group.to_record(assignment), done)
        return None

    def _remove_pending_sync(self, group: ClassicGroup, member_id: str) -> None:
        group.pending_sync.discard(member_id)
        if not group.pending_sync or group.is_in(_S.DEAD, _S.EMPTY, _S.PREPARING_REBALANCE):
            self.rebalance.cancel_sync(group)

    # -- Heartbeat / LeaveGroup -----------------------------------------------------------------

    def _heartbeat(self, req: HeartbeatRequestData) -> HeartbeatResponseData:
        if not req.group_id:
            return HeartbeatResponseData(error_code=ErrorCode.invalid_group_id)
        group = self.groups.get(req.group_id)
        if group is None:
            return HeartbeatResponseData(error_code=ErrorCode.unknown_member_id)
        if group.is_in(_S.DEAD):
            return HeartbeatResponseData(error_code=ErrorCode.coordinator_not_available)
        error = group.validate_member(req.member_id, req.group_instance_id)
        if error is not ErrorCode.none:
            return HeartbeatResponseData(error_code=error)
        if req.generation_id != group.generation:
            return HeartbeatResponseData(error_code=ErrorCode.illegal_generation)
        if group.is_in(_S.EMPTY):
            return HeartbeatResponseData(error_code=ErrorCode.unknown_member_id)
        self.rebalance.schedule_heartbeat(group, group.members[req.member_id])
        if group.is_in(_S.PREPARING_REBALANCE):
            return HeartbeatResponseData(error_code=ErrorCode.rebalance_in_progress)
        return HeartbeatResponseData()

    def _leave(self, req: LeaveGroupRequestData) -> LeaveGroupResponseData:
        if not req.group_id:
            return LeaveGroupResponseData(error_code=ErrorCode.invalid_group_id)
        group = self.groups.get(req.group_id)
        if group is None:
            return LeaveGroupResponseData(error_code=ErrorCode.unknown_member_id)
        if group.is_in(_S.DEAD):
            return LeaveGroupResponseData(error_code=ErrorCode.coordinator_not_available)
        results: list[LeaveMemberResponse] = []
        for identity in req.members:
            error = ErrorCode.none
            if identity.member_id == "":
                # Administrative removal of a static member by instance id only.
                target = group.static_members.get(identity.group_instance_id or "")
                if identity.group_instance_id is not None and target is not None:
                    self.rebalance.drop_member(group, group.members[target])
                else:
                    error = ErrorCode.unknown_member_id
            elif identity.member_id in group.pending_join:
                group.remove(identity.member_id)
                self.rebalance.cancel_heartbeat(group, identity.member_id)
            else:
                error = group.validate_member(identity.member_id, identity.group_instance_id)
                if error is ErrorCode.none:
                    self.rebalance.drop_member(group, group.members[identity.member_id])
            results.append(LeaveMemberResponse(identity.member_id, identity.group_instance_id, error))
        if any(r.error_code is ErrorCode.none for r in results):
            if group.is_in(_S.STABLE, _S.COMPLETING_REBALANCE):
                self.rebalance.maybe_prepare_rebalance_or_complete_join(group)
            elif group.is_in(_S.PREPARING_REBALANCE):
                self.rebalance.maybe_complete_join_phase(group)
        return LeaveGroupResponseData(members=tuple(results))


def _inconsistent(requested: str | None, current: str | None) -> bool:
    return requested is not None and current is not None and requested != current
