"""Classic consumer-group coordinator (JoinGroup/SyncGroup/Heartbeat/LeaveGroup, offsets, KIP-447).

See ``README.md`` in this folder for how the coordinator runtime drives it.
"""

from exactly.coordinator.group.coordinator import GroupCoordinator, GroupCoordinatorConfig
from exactly.coordinator.group.records import partition_for
from exactly.coordinator.group.state import GroupState

__all__ = [
    "GroupCoordinator",
    "GroupCoordinatorConfig",
    "GroupState",
    "partition_for",
]
