"""Topic-level log configuration, with Kafka's names and defaults.

Topic configs are stored and described under their Kafka names (``segment.bytes`` ...), so admin
clients' DescribeConfigs/CreateTopics(configs=...) round-trip unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

# Kafka name -> (field name, parser)
_KAFKA_NAMES: dict[str, str] = {
    "segment.bytes": "segment_bytes",
    "segment.ms": "segment_ms",
    "segment.index.bytes": "segment_index_bytes",
    "index.interval.bytes": "index_interval_bytes",
    "retention.bytes": "retention_bytes",
    "retention.ms": "retention_ms",
    "flush.messages": "flush_messages",
    "flush.ms": "flush_ms",
    "max.message.bytes": "max_message_bytes",
    "cleanup.policy": "cleanup_policy",
    "min.cleanable.dirty.ratio": "min_cleanable_dirty_ratio",
    "min.compaction.lag.ms": "min_compaction_lag_ms",
    "max.compaction.lag.ms": "max_compaction_lag_ms",
    "delete.retention.ms": "delete_retention_ms",
    "message.timestamp.type": "message_timestamp_type",
    "min.insync.replicas": "min_insync_replicas",
    "unclean.leader.election.enable": "unclean_leader_election_enable",
}

LONG_MAX = 2**63 - 1


class InvalidConfigError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class LogConfig:
    segment_bytes: int = 1_073_741_824
    segment_ms: int = 604_800_000
    segment_index_bytes: int = 10_485_760
    index_interval_bytes: int = 4096
    retention_bytes: int = -1
    retention_ms: int = 604_800_000
    flush_messages: int = LONG_MAX
    flush_ms: int = LONG_MAX
    max_message_bytes: int = 1_048_588
    cleanup_policy: str = "delete"
    # Log compaction (cleanup.policy containing "compact"): see storage.cleaner.
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = LONG_MAX
    delete_retention_ms: int = 86_400_000
    message_timestamp_type: str = "CreateTime"
    min_insync_replicas: int = 1
    # "true"/"false" (a string: the override parser treats bools as ints); read by the cluster's
    # controller when no ISR member is left, never by storage.
    unclean_leader_election_enable: str = "false"

    def with_overrides(self, overrides: Mapping[str, str | None]) -> LogConfig:
        """Apply Kafka-named overrides; raises InvalidConfigError for unknown names or values."""
        changes: dict[str, object] = {}
        for name, raw in overrides.items():
            if raw is None:
                continue
            attr = _KAFKA_NAMES.get(name)
            if attr is None:
                raise InvalidConfigError(f"Unknown topic config name: {name}")
            current = getattr(self, attr)
            if isinstance(current, float):
                try:
                    ratio = float(raw)
                except ValueError:
                    raise InvalidConfigError(f"Invalid value {raw} for configuration {name}") from None
                if not 0.0 <= ratio <= 1.0:
                    raise InvalidConfigError(
                        f"Invalid value {raw} for configuration {name}: must be in [0, 1]"
                    )
                changes[attr] = ratio
            elif isinstance(current, int):
                try:
                    changes[attr] = int(raw)
                except ValueError:
                    raise InvalidConfigError(f"Invalid value {raw} for configuration {name}") from None
            else:
                if name == "cleanup.policy" and raw not in (
                    "delete",
                    "compact",
                    "compact,delete",
                    "delete,compact",
                ):
                    raise InvalidConfigError(f"Invalid value {raw} for configuration {name}")
                if name == "message.timestamp.type" and raw not in ("CreateTime", "LogAppendTime"):
                    raise InvalidConfigError(f"Invalid value {raw} for configuration {name}")
                if name == "unclean.leader.election.enable":
                    if raw.strip().lower() not in ("true", "false"):
                        raise InvalidConfigError(f"Invalid value {raw} for configuration {name}")
                    raw = raw.strip().lower()
                changes[attr] = raw
        if changes.get("segment_bytes", self.segment_bytes) < 14:  # type: ignore[operator]
            raise InvalidConfigError("segment.bytes must be at least 14")
        updated = dataclasses.replace(self, **changes)  # type: ignore[arg-type]
        if updated.min_compaction_lag_ms > updated.max_compaction_lag_ms:
            raise InvalidConfigError(
                f"conflict topic config setting: min.compaction.lag.ms {updated.min_compaction_lag_ms} > "
                f"max.compaction.lag.ms {updated.max_compaction_lag_ms}"
            )
        return updated

    @property
    def compact(self) -> bool:
        """cleanup.policy contains compact: the log cleaner compacts this log."""
        return "compact" in self.cleanup_policy.split(",")

    @property
    def delete(self) -> bool:
        """cleanup.policy contains delete: retention.ms / retention.bytes apply."""
        return "delete" in self.cleanup_policy.split(",")

    def as_kafka_configs(self) -> dict[str, str]:
        return {name: str(getattr(self, attr)) for name, attr in _KAFKA_NAMES.items()}
