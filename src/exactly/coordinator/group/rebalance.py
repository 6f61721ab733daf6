"""The rebalance machinery of classic groups: join phase, generations, timers, assignment fan-out.

Kafka's ``prepareRebalance`` / ``completeClassicGroupJoin`` / ``expirePendingSync`` /
``expireClassicGroupMemberHeartbeat``, split from the request handlers in ``membership.py`` so each
module stays readable. Every method runs inside an operation (see ``core.py``) and may emit writes.

The :class:`Rebalancer` owns no state of its own: it drives the groups the membership part owns
(it is handed that dictionary) and keeps its timers in the shared :class:`Operations`. It owns the
*timer keys* of a group, listed below, and every rule about them.

Timers (keys in ``Operations.timers``):

- ``("heartbeat", group, member)``: the member's session; a heartbeat, offset commit or completed
  join/sync pushes it forward. Expiry removes the member and rebalances. A member handed an id with
  MEMBER_ID_REQUIRED has one too, so an abandoned id is dropped.
- ``("join", group)``: the end of the join phase -- the rebalance timeout, or during the first
  rebalance of an Empty group the ``initial_rebalance_delay_ms`` window, extended (up to the rebalance
  timeout) while new members keep arriving, so a starting consumer fleet gets one rebalance, not N.
- ``("sync", group)``: members that got a JoinGroup answer but never sent SyncGroup within the
  rebalance timeout are removed and the group rebalances.

Invariants:

- at most one ``("join", group)`` and one ``("sync", group)`` timer per group;
- a group leaves PreparingRebalance only through :meth:`Rebalancer.complete_join`;
- the first rebalance of an Empty group ends only when its initial-delay timer fires, so members of a
  starting fleet are collected into one generation;
- dropping a member answers its parked JoinGroup/SyncGroup (no connection waits forever).
"""

from __future__ import annotations

from collections.abc import Callable

from kio.schema.errors import ErrorCode

from exactly.coordinator.group.api import JoinGroupResponseData, SyncGroupResponseData
from exactly.coordinator.group.core import GroupCoordinatorConfig, Operations
from exactly.coordinator.group.group import ClassicGroup
from exactly.coordinator.group.member import GroupMember
from exactly.coordinator.group.state import GroupState

_S = GroupState


class Rebalancer:
    """Rebalance steps shared by JoinGroup, SyncGroup, LeaveGroup, offset commits and the timers.

    Holds references only: the config, the shared :class:`Operations` and the membership part's
    ``groups`` (read to tell whether a timer's group is still the current one).
    """

    def __init__(
        self, config: GroupCoordinatorConfig, ops: Operations, groups: dict[str, ClassicGroup]
    ) -> None:
        self.config = config
        self._ops = ops
        self._groups = groups

    def is_current(self, group: ClassicGroup) -> bool:
        """Timers and completions capture a group object; ignore them if it was replaced/removed."""
        return self._groups.get(group.group_id) is group

    # -- timers ---------------------------------------------------------------------------------

    def schedule_heartbeat(
        self, group: ClassicGroup, member: GroupMember, timeout_ms: int | None = None
    ) -> None:
        self.schedule_session(
            group, member.member_id, member.session_timeout_ms if timeout_ms is None else timeout_ms
        )

    def schedule_session(self, group: ClassicGroup, member_id: str, timeout_ms: int) -> None:
        self._ops.timers.schedule(
            ("heartbeat", group.group_id, member_id),
            self._ops.now + timeout_ms,
            lambda: self._on_heartbeat_expired(group, member_id),
        )

    def cancel_heartbeat(self, group: ClassicGroup, member_id: str) -> None:
        self._ops.timers.cancel(("heartbeat", group.group_id, member_id))

    def cancel_sync(self, group: ClassicGroup) -> None:
        self._ops.timers.cancel(("sync", group.group_id))

    def cancel_all(self, group: ClassicGroup) -> None:
        """Forget every timer of ``group`` (it is being removed or replaced)."""
        for member_id in list(group.members) + list(group.pending_join):
            self.cancel_heartbeat(group, member_id)
        for kind in ("join", "sync"):
            self._ops.timers.cancel((kind, group.group_id))

    def join_response(
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

    def maybe_prepare_rebalance_or_complete_join(self, group: ClassicGroup) -> None:
        if group.can_rebalance():
            self.prepare_rebalance(group)
        else:
            self.maybe_complete_join_phase(group)

    def maybe_complete_join_phase(self, group: ClassicGroup) -> None:
        # The first rebalance of an Empty group ends only by its delay timer (more members may come).
        if (
            group.is_in(_S.PREPARING_REBALANCE)
            and group.has_all_members_joined()
            and group.previous_state is not _S.EMPTY
        ):
            self.complete_join(group)

    def prepare_rebalance(self, group: ClassicGroup) -> None:
        if group.is_in(_S.COMPLETING_REBALANCE):
            self.propagate_assignment(group, ErrorCode.rebalance_in_progress, reset=True)
        group.pending_sync.clear()
        self.cancel_sync(group)
        initial = group.is_in(_S.EMPTY)
        if initial:
            delay = self.config.initial_rebalance_delay_ms
            remaining = max(group.rebalance_timeout_ms() - delay, 0)
            self._schedule_join(group, delay, lambda: self._try_complete_initial(group, delay, remaining))
        group.transition_to(_S.PREPARING_REBALANCE, self._ops.now)
        if not initial:
            if group.has_all_members_joined():
                self.complete_join(group)
            else:
                self._schedule_join(group, group.rebalance_timeout_ms(), lambda: self.complete_join(group))

    def _schedule_join(self, group: ClassicGroup, delay_ms: int, action: Callable[[], None]) -> None:
        def fire() -> None:
            if self.is_current(group):
                action()

        self._ops.timers.schedule(("join", group.group_id), self._ops.now + delay_ms, fire)

    def _try_complete_initial(self, group: ClassicGroup, delay: int, remaining: int) -> None:
        if group.new_member_added and remaining != 0:
            group.new_member_added = False
            new_delay = min(self.config.initial_rebalance_delay_ms, remaining)
            new_remaining = max(remaining - delay, 0)
            self._schedule_join(
                group, new_delay, lambda: self._try_complete_initial(group, new_delay, new_remaining)
            )
        else:
            self.complete_join(group)

    def complete_join(self, group: ClassicGroup) -> None:
        self._ops.timers.cancel(("join", group.group_id))
        for member in group.not_yet_rejoined():
            if not member.is_static:
                self.drop_member(group, member)
        if group.is_in(_S.DEAD):
            return
        if not group.maybe_elect_new_joined_leader() and group.members:
            # Nobody re-joined: wait another rebalance timeout for sessions to expire the silent ones.
            self._schedule_join(
                group, max(group.rebalance_timeout_ms(), 1), lambda: self.complete_join(group)
            )
            return
        group.init_next_generation(self._ops.now)
        if group.is_in(_S.EMPTY):
            self._ops.emit_group_record(group.group_id, group.to_record({}), lambda result: None)
            return
        for member in list(group.members.values()):
            group.complete_join(
                member, self.join_response(group, member, with_members=group.is_leader(member.member_id))
            )
            self.schedule_heartbeat(group, member)
            member.is_new = False
            group.pending_sync.add(member.member_id)
        generation = group.generation
        self._ops.timers.schedule(
            ("sync", group.group_id),
            self._ops.now + group.rebalance_timeout_ms(),
            lambda: self._expire_pending_sync(group, generation),
        )

    def _expire_pending_sync(self, group: ClassicGroup, generation: int) -> None:
        if not self.is_current(group) or generation != group.generation:
            return
        if group.is_in(_S.COMPLETING_REBALANCE, _S.STABLE) and group.pending_sync:
            for member_id in sorted(group.pending_sync):
                member = group.members.get(member_id)
                if member is not None:
                    self.drop_member(group, member)
            self.prepare_rebalance(group)

    def drop_member(self, group: ClassicGroup, member: GroupMember) -> None:
        """Remove a member, answering any parked request so no connection waits forever."""
        group.complete_join(member, JoinGroupResponseData(error_code=ErrorCode.unknown_member_id))
        group.complete_sync(member, SyncGroupResponseData(error_code=ErrorCode.unknown_member_id))
        group.remove(member.member_id)
        self.cancel_heartbeat(group, member.member_id)

    def _on_heartbeat_expired(self, group: ClassicGroup, member_id: str) -> None:
        if not self.is_current(group) or group.is_in(_S.DEAD):
            return
        if member_id in group.pending_join:
            group.remove(member_id)
            if group.is_in(_S.PREPARING_REBALANCE) and group.has_all_members_joined():
                self.complete_join(group)
            return
        member = group.members.get(member_id)
        if member is None or member.has_satisfied_heartbeat():
            return
        self.drop_member(group, member)
        if group.is_in(_S.STABLE, _S.COMPLETING_REBALANCE):
            self.maybe_prepare_rebalance_or_complete_join(group)
        elif group.is_in(_S.PREPARING_REBALANCE) and group.has_all_members_joined():
            self.complete_join(group)

    def propagate_assignment(self, group: ClassicGroup, error: ErrorCode, *, reset: bool) -> None:
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
                self.schedule_heartbeat(group, member)
