"""Version-neutral requests and responses of the group coordinator.

Why not kio's classes directly: kio has one class per API *version*; the coordinator's rules do not
depend on the version except in a few documented places (``api_version`` fields below). The handlers
translate kio request objects of any version into these values and the answers back into the kio
response class of the request's version. That keeps this package free of wire details
and gives the tests a small surface.

What operations return to the runtime (writes to append, replies to deliver) is the shape both
coordinators share: :mod:`exactly.coordinator.result`.
"""

from __future__ import annotations

from dataclasses import dataclass

from kio.schema.errors import ErrorCode

NO_GENERATION = -1
UNKNOWN_MEMBER_ID = ""


# ---------------------------------------------------------------------------------------------
# JoinGroup / SyncGroup / Heartbeat / LeaveGroup
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Protocol:
    """One (name, metadata) entry of a JoinGroup request, in the member's preference order."""

    name: str
    metadata: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class JoinGroupRequestData:
    """JoinGroup v0-v9. For v0 the handler sets ``rebalance_timeout_ms = session_timeout_ms``.

    ``api_version >= 4`` makes a dynamic member with an empty id get MEMBER_ID_REQUIRED first
    (KIP-394); ``api_version >= 9`` lets a re-joining static leader skip the assignment.
    """

    group_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    member_id: str
    protocol_type: str
    protocols: tuple[Protocol, ...]
    group_instance_id: str | None = None
    reason: str | None = None
    api_version: int = 9
    client_id: str = ""
    client_host: str = ""


@dataclass(frozen=True, slots=True)
class JoinGroupMember:
    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class JoinGroupResponseData:
    error_code: ErrorCode = ErrorCode.none
    generation_id: int = NO_GENERATION
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    skip_assignment: bool = False
    member_id: str = UNKNOWN_MEMBER_ID
    members: tuple[JoinGroupMember, ...] = ()


@dataclass(frozen=True, slots=True)
class SyncGroupAssignment:
    member_id: str
    assignment: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncGroupRequestData:
    """SyncGroup v0-v5; ``protocol_type``/``protocol_name`` are None before v5 (not checked)."""

    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignments: tuple[SyncGroupAssignment, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncGroupResponseData:
    error_code: ErrorCode = ErrorCode.none
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatRequestData:
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatResponseData:
    error_code: ErrorCode = ErrorCode.none


@dataclass(frozen=True, slots=True)
class LeaveMember:
    member_id: str
    group_instance_id: str | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaveGroupRequestData:
    """LeaveGroup; v0-v2 carry one member id, which the handler wraps in ``members``."""

    group_id: str
    members: tuple[LeaveMember, ...]


@dataclass(frozen=True, slots=True)
class LeaveMemberResponse:
    member_id: str
    group_instance_id: str | None
    error_code: ErrorCode = ErrorCode.none


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaveGroupResponseData:
    """For v0-v2 the handler answers ``error_code`` or, if none, the single member's error."""

    error_code: ErrorCode = ErrorCode.none
    members: tuple[LeaveMemberResponse, ...] = ()


# ---------------------------------------------------------------------------------------------
# Offsets
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitPartition:
    partition_index: int
    committed_offset: int
    committed_leader_epoch: int = -1
    committed_metadata: str | None = None


@dataclass(frozen=True, slots=True)
class CommitTopic:
    name: str
    partitions: tuple[CommitPartition, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommitRequestData:
    """OffsetCommit v0-v9; ``retention_time_ms`` (v2-v4) other than -1 sets an expiry."""

    group_id: str
    topics: tuple[CommitTopic, ...]
    generation_id: int = NO_GENERATION
    member_id: str = UNKNOWN_MEMBER_ID
    group_instance_id: str | None = None
    retention_time_ms: int = -1
    api_version: int = 8


@dataclass(frozen=True, slots=True, kw_only=True)
class TxnOffsetCommitRequestData:
    """TxnOffsetCommit v0-v5; before v3 (KIP-447) generation is -1 and member id empty."""

    transactional_id: str
    group_id: str
    producer_id: int
    producer_epoch: int
    topics: tuple[CommitTopic, ...]
    generation_id: int = NO_GENERATION
    member_id: str = UNKNOWN_MEMBER_ID
    group_instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class CommitPartitionResult:
    partition_index: int
    error_code: ErrorCode = ErrorCode.none


@dataclass(frozen=True, slots=True)
class CommitTopicResult:
    name: str
    partitions: tuple[CommitPartitionResult, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommitResponseData:
    """Answer to OffsetCommit and TxnOffsetCommit (same shape)."""

    topics: tuple[CommitTopicResult, ...] = ()


@dataclass(frozen=True, slots=True)
class FetchTopic:
    name: str
    partition_indexes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class FetchGroup:
    """One group of OffsetFetch; ``topics=None`` means all committed offsets of the group."""

    group_id: str
    topics: tuple[FetchTopic, ...] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetFetchRequestData:
    """OffsetFetch; v0-v7 have one group, v8+ several (the handler wraps)."""

    groups: tuple[FetchGroup, ...]
    require_stable: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchPartitionResult:
    partition_index: int
    committed_offset: int = -1
    committed_leader_epoch: int = -1
    metadata: str = ""
    error_code: ErrorCode = ErrorCode.none


@dataclass(frozen=True, slots=True)
class FetchTopicResult:
    name: str
    partitions: tuple[FetchPartitionResult, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchGroupResult:
    group_id: str
    topics: tuple[FetchTopicResult, ...] = ()
    error_code: ErrorCode = ErrorCode.none


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetFetchResponseData:
    groups: tuple[FetchGroupResult, ...] = ()


# ---------------------------------------------------------------------------------------------
# DescribeGroups / ListGroups / DeleteGroups
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class DescribedMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    member_metadata: bytes
    member_assignment: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class DescribedGroup:
    group_id: str
    error_code: ErrorCode = ErrorCode.none
    group_state: str = "Dead"
    protocol_type: str = ""
    protocol_data: str = ""
    members: tuple[DescribedMember, ...] = ()


@dataclass(frozen=True, slots=True)
class ListedGroup:
    group_id: str
    protocol_type: str
    group_state: str
    group_type: str = "classic"


@dataclass(frozen=True, slots=True)
class DeleteGroupResult:
    group_id: str
    error_code: ErrorCode = ErrorCode.none


# ---------------------------------------------------------------------------------------------
# Offset retention (periodic cleanup)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class CleanupStats:
    """Outcome of one ``cleanup_group_metadata`` run, counted after its appends completed.

    ``failed_appends`` counts ``__consumer_offsets`` partitions whose tombstones could not be
    written; their offsets and groups stay and the next run retries them.
    """

    offsets_removed: int = 0
    groups_removed: int = 0
    failed_appends: int = 0
