"""Classic consumer-group coordinator (JoinGroup/SyncGroup/Heartbeat/LeaveGroup, offsets, KIP-447).

See ``README.md`` in this folder for how the asyncio shell drives it.
"""

from exactly.coordinator.group.api import AppendRecords, AppendResult
from exactly.coordinator.group.coordinator import GroupCoordinator, GroupCoordinatorConfig
from exactly.coordinator.group.records import partition_for
from exactly.coordinator.group.state import GroupState

__all__ = [
    "AppendRecords",
    "AppendResult",
    "GroupCoordinator",
    "GroupCoordinatorConfig",
    "GroupState",
    "partition_for",
]
