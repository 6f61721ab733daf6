"""Classic group states and the one table of legal transitions.

Theory of operation
-------------------
A classic (JoinGroup/SyncGroup) group cycles through these states::

    Empty --join--> PreparingRebalance --all joined / timeout--> CompletingRebalance
      ^                 ^        |                                      |
      |                 |        +--no member left--> Empty             | leader's SyncGroup persisted
      |                 +---- join / leave / session timeout ----- Stable <-+
      +-- any state --> Dead (group deleted, expired or unloaded; final)

Each state lists the states it may be entered from (Kafka's ``ClassicGroupState``); every change goes
through :func:`check_transition`, so an impossible move is a bug that raises instead of silently
corrupting the membership. ``name`` is the string Kafka puts on the wire (DescribeGroups,
ListGroups); ListGroups' states filter compares it case-insensitively.

What each state does with requests (the rules the coordinator implements):

- Empty: JoinGroup from new members starts a rebalance; SyncGroup/Heartbeat/LeaveGroup from anyone ->
  UNKNOWN_MEMBER_ID; offset commits with generation -1 are accepted (simple consumers).
- PreparingRebalance: JoinGroup requests are parked until every expected member re-joined or the
  rebalance timeout fired; Heartbeat/SyncGroup -> REBALANCE_IN_PROGRESS.
- CompletingRebalance: followers' SyncGroup requests are parked until the leader's assignment is
  persisted; Heartbeat -> REBALANCE_IN_PROGRESS; OffsetCommit -> REBALANCE_IN_PROGRESS.
- Stable: heartbeats keep members alive; a leader's JoinGroup or changed metadata rebalances.
- Dead: terminal; requests get COORDINATOR_NOT_AVAILABLE so clients re-discover the coordinator.
"""

from __future__ import annotations

import enum


class InvalidGroupTransition(RuntimeError):
    """Raised when code tries a state change the table forbids (always a coordinator bug)."""


class GroupState(enum.Enum):
    """The five classic group states; the value is Kafka's wire name."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"

    @property
    def wire_name(self) -> str:
        """The name DescribeGroups/ListGroups return (``"Stable"``, ...)."""
        return self.value

    @classmethod
    def from_wire(cls, name: str) -> GroupState | None:
        """Case-insensitive lookup used by ListGroups' states filter; None if unknown."""
        lowered = name.lower()
        for state in cls:
            if state.value.lower() == lowered:
                return state
        return None


# The one table: target state -> states it may be entered from (Kafka ClassicGroupState).
VALID_PREVIOUS_STATES: dict[GroupState, frozenset[GroupState]] = {
    GroupState.EMPTY: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.PREPARING_REBALANCE: frozenset(
        {GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY}
    ),
    GroupState.COMPLETING_REBALANCE: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.STABLE: frozenset({GroupState.COMPLETING_REBALANCE}),
    GroupState.DEAD: frozenset(
        {
            GroupState.STABLE,
            GroupState.PREPARING_REBALANCE,
            GroupState.COMPLETING_REBALANCE,
            GroupState.EMPTY,
            GroupState.DEAD,
        }
    ),
}


def can_transition(source: GroupState, target: GroupState) -> bool:
    """True if ``target`` may be entered from ``source``."""
    return source in VALID_PREVIOUS_STATES[target]


def check_transition(source: GroupState, target: GroupState) -> None:
    """Raise :class:`InvalidGroupTransition` unless ``source -> target`` is in the table."""
    if not can_transition(source, target):
        raise InvalidGroupTransition(f"group cannot move from {source.value} to {target.value}")
