"""The rebalance machinery of classic groups: join phase, generations, timers, assignment fan-out.

Kafka's ``prepareRebalance`` / ``completeClassicGroupJoin`` / ``expirePendingSync`` /
``expireClassicGroupMemberHeartbeat``, split from the request handlers in ``membership.py`` so each
module stays readable. Every method runs inside an operation (see ``core.py``) and may emit effects.

Invariants:

- at most one ``("join", group)`` and one ``("sync", group)`` timer per group;
- a group leaves PreparingRebalance only through :meth:`RebalanceMixin._complete_join`;
- the first rebalance of an Empty group ends only when its initial-delay timer fires, so members of a
  starting fleet are collected into one generation;
- dropping a member answers its parked JoinGroup/SyncGroup (no connection waits forever).
"""

from __future__ import annotations

from collections.abc import Callable

from kio.schema.errors import ErrorCode

from exactly.coordinator.group.api import JoinGroupResponseData, SyncGroupResponseData
from exactly.coordinator.group.core import CoordinatorCore
from exactly.coordinator.group.group import ClassicGroup
from exactly.coordinator.group.member import GroupMember
from exactly.coordinator.group.state import GroupState

_S = GroupState


class RebalanceMixin(CoordinatorCore):
    """Rebalance steps shared by JoinGroup, SyncGroup, LeaveGroup and the timers."""

    def _join_response(
        self,
        group: ClassicGroup,
        member: GroupMember,
        *,
        with_members: bool,
        skip_assignment: bool = False,
        leader: str | None = None,
    ) -> JoinGroupResponseData:
        return JoinGroupResponseData(
            generation_id=group.generation,
            protocol_type=group.protocol_type,
            protocol_name=group.protocol_name,
            leader=(leader if leader is not None else group.leader_id) or "",
            skip_assignment=skip_assignment,
            member_id=member.member_id,
            members=group.join_members() if with_members else (),
        )

    # -- rebalance ------------------------------------------------------------------------------

    def _maybe_prepare_rebalance_or_complete_join(self, group: ClassicGroup) -> None:
        if group.can_rebalance():
            self._prepare_rebalance(group)
        else:
            self._maybe_complete_join_phase(group)

    def _maybe_complete_join_phase(self, group: ClassicGroup) -> None:
        # The first rebalance of an Empty group ends only by its delay timer (more members may come).
        if (
            group.is_in(_S.PREPARING_REBALANCE)
            and group.has_all_members_joined()
            and group.previous_state is not _S.EMPTY
        ):
            self._complete_join(group)

    def _prepare_rebalance(self, group: ClassicGroup) -> None:
        if group.is_in(_S.COMPLETING_REBALANCE):
            self._propagate_assignment(group, ErrorCode.rebalance_in_progress, reset=True)
        group.pending_sync.clear()
        self.timers.cancel(("sync", group.group_id))
        initial = group.is_in(_S.EMPTY)
        if initial:
            delay = self.config.initial_rebalance_delay_ms
            remaining = max(group.rebalance_timeout_ms() - delay, 0)
            self._schedule_join(group, delay, lambda: self._try_complete_initial(group, delay, remaining))
        group.transition_to(_S.PREPARING_REBALANCE, self._now)
        if not initial:
            if group.has_all_members_joined():
                self._complete_join(group)
            else:
                self._schedule_join(group, group.rebalance_timeout_ms(), lambda: self._complete_join(group))

    def _schedule_join(self, group: ClassicGroup, delay_ms: int, action: Callable[[], None]) -> None:
        def fire() -> None:
            if self._is_current(group):
                action()

        self.timers.schedule(("join", group.group_id), self._now + delay_ms, fire)

    def _try_complete_initial(self, group: ClassicGroup, delay: int, remaining: int) -> None:
        if group.new_member_added and remaining != 0:
            group.new_member_added = False
            new_delay = min(self.config.initial_rebalance_delay_ms, remaining)
            new_remaining = max(remaining - delay, 0)
            self._schedule_join(
                group, new_delay, lambda: self._try_complete_initial(group, new_delay, new_remaining)
            )
        else:
            self._complete_join(group)

    def _complete_join(self, group: ClassicGroup) -> None:
        self.timers.cancel(("join", group.group_id))
        for member in group.not_yet_rejoined():
            if not member.is_static:
                self._drop_member(group, member)
        if group.is_in(_S.DEAD):
            return
        if not group.maybe_elect_new_joined_leader() and group.members:
            # Nobody re-joined: wait another rebalance timeout for sessions to expire the silent ones.
            self._schedule_join(
                group, max(group.rebalance_timeout_ms(), 1), lambda: self._complete_join(group)
            )
            return
        group.init_next_generation(self._now)
        if group.is_in(_S.EMPTY):
            self._emit_group_record(group, group.to_record({}), lambda result: None)
            return
        for member in list(group.members.values()):
            group.complete_join(
                member, self._join_response(group, member, with_members=group.is_leader(member.member_id))
            )
            self._schedule_heartbeat(group, member)
            member.is_new = False
            group.pending_sync.add(member.member_id)
        generation = group.generation
        self.timers.schedule(
            ("sync", group.group_id),
            self._now + group.rebalance_timeout_ms(),
            lambda: self._expire_pending_sync(group, generation),
        )

    def _expire_pending_sync(self, group: ClassicGroup, generation: int) -> None:
        if not self._is_current(group) or generation != group.generation:
            return
        if group.is_in(_S.COMPLETING_REBALANCE, _S.STABLE) and group.pending_sync:
            for member_id in sorted(group.pending_sync):
                member = group.members.get(member_id)
                if member is not None:
                    self._drop_member(group, member)
            self._prepare_rebalance(group)

    def _drop_member(self, group: ClassicGroup, member: GroupMember) -> None:
        """Remove a member, answering any parked request so no connection waits forever."""
        group.complete_join(member, JoinGroupResponseData(error_code=ErrorCode.unknown_member_id))
        group.complete_sync(member, SyncGroupResponseData(error_code=ErrorCode.unknown_member_id))
        group.remove(member.member_id)
        self._cancel_heartbeat(group, member.member_id)

    def _on_heartbeat_expired(self, group: ClassicGroup, member_id: str) -> None:
        if not self._is_current(group) or group.is_in(_S.DEAD):
            return
        if member_id in group.pending_join:
            group.remove(member_id)
            if group.is_in(_S.PREPARING_REBALANCE) and group.has_all_members_joined():
                self._complete_join(group)
            return
        member = group.members.get(member_id)
        if member is None or member.has_satisfied_heartbeat():
            return
        self._drop_member(group, member)
        if group.is_in(_S.STABLE, _S.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance_or_complete_join(group)
        elif group.is_in(_S.PREPARING_REBALANCE) and group.has_all_members_joined():
            self._complete_join(group)

    def _propagate_assignment(self, group: ClassicGroup, error: ErrorCode, *, reset: bool) -> None:
        ok = error is ErrorCode.none
        for member in group.members.values():
            if reset:
                member.assignment = b""
            answered = group.complete_sync(
                member,
                SyncGroupResponseData(
                    error_code=error,
                    protocol_type=group.protocol_type if ok else None,
                    protocol_name=group.protocol_name if ok else None,
                    assignment=member.assignment,
                ),
            )
            if answered:
                self._schedule_heartbeat(group, member)
