"""The group coordinator's load takes fast paths (records read without ``Record`` objects, markers
by their type alone, offset-commit keys and values by struct unpacks). Loading a mixed
``__consumer_offsets`` log through them must give exactly the state the generic path gives: plain
commits of every value version, transactional commits decided by COMMIT and by ABORT markers and
one left open, offset and group tombstones, group metadata, a record type the coordinator does not
own and an undecodable record. The reference replays the same bytes with ``decode_batch``,
``read_control_marker`` and the generic ``Reader``-based decoders."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from exactly.coordinator.group import GroupCoordinator, GroupCoordinatorConfig
from exactly.coordinator.group import coordinator as coordinator_module
from exactly.coordinator.group import records as group_records
from exactly.coordinator.group.records import (
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadata,
    OffsetCommitKey,
    OffsetCommitValue,
    RecordKey,
    RecordValue,
    encode_key,
    encode_offset_commit_value,
    encode_record,
    partition_for,
)
from exactly.records.batch import iter_batches
from exactly.records.builder import decode_batch
from exactly.records.control import ControlType, read_control_marker
from exactly.server import internal_topics
from exactly.server.broker import Broker
from exactly.server.config import BrokerConfig
from exactly.server.coordinator_runtime import CoordinatorRuntime
from exactly.server.internal_topics import InternalTopics, ReplayedBatch
from exactly.topics import CONSUMER_OFFSETS_TOPIC
from exactly.types import TopicPartition

PARTITIONS = 2
GROUPS = ("orders", "billing", "größe-✓", "audit")
COMMITTED, ABORTED, OPEN = 5000, 5001, 5002


def generic_decode_record(key: bytes, value: bytes | None) -> tuple[RecordKey, RecordValue | None] | None:
    """decode_record through the Reader-based decoders only (the fast paths' reference)."""
    decoded_key = group_records._decode_key(key)
    if decoded_key is None:
        return None
    if value is None:
        return decoded_key, None
    if isinstance(decoded_key, OffsetCommitKey):
        return decoded_key, group_records._decode_offset_commit_value(value)
    return decoded_key, group_records.decode_group_metadata_value(value)


class GenericReplay:
    """InternalTopics.replay as it read before the fast paths: decode_batch and read_control_marker."""

    replicated = False

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def replay(self, topic: str, partitions: Iterable[int] | None = None) -> Iterator[ReplayedBatch]:
        for partition in range(PARTITIONS):
            plog = self.broker.logs.get_partition(TopicPartition(topic, partition))
            assert plog is not None
            data = plog.read(
                plog.log_start_offset, 1 << 24, read_committed=False, min_one_batch=True, up_to_log_end=True
            ).records
            assert isinstance(data, bytes)
            for header in iter_batches(data):
                if header.is_control:
                    yield ReplayedBatch(
                        partition,
                        header.base_offset,
                        header.producer_id,
                        True,
                        read_control_marker(data, header).type,
                        (),
                    )
                    continue
                _h, recs = decode_batch(data, header.position)
                entries = tuple((r.offset, r.key, r.value) for r in recs)
                yield ReplayedBatch(
                    partition, header.base_offset, header.producer_id, header.is_transactional, None, entries
                )


def commit(
    group: str, topic: str, partition: int, value: OffsetCommitValue, version: int
) -> tuple[bytes, bytes]:
    return encode_key(OffsetCommitKey(group, topic, partition)), encode_offset_commit_value(value, version)


def write_mixed_log(internal: InternalTopics) -> None:
    member = MemberMetadata(member_id="m-1", client_id="c", client_host="/127.0.0.1", session_timeout=10_000)
    metadata = GroupMetadataValue(
        protocol_type="consumer", generation=3, protocol="range", leader="m-1", members=(member,)
    )
    for i, group in enumerate(GROUPS):
        p = partition_for(group, PARTITIONS)
        plain = [
            commit(group, "in", 0, OffsetCommitValue(offset=10 + i, metadata="m", commit_timestamp=1), 3),
            commit(group, "in", 1, OffsetCommitValue(offset=20, commit_timestamp=2, expire_timestamp=9), 1),
            commit(group, "in", 2, OffsetCommitValue(offset=30, metadata="ü", commit_timestamp=3), 0),
            commit(group, "in", 3, OffsetCommitValue(offset=40, commit_timestamp=4), 2),
            commit(group, "in", 4, OffsetCommitValue(offset=50, leader_epoch=7, commit_timestamp=5), 4),
            commit(group, "in", 0, OffsetCommitValue(offset=11 + i, commit_timestamp=6, leader_epoch=2), 3),
        ]
        internal.append(CONSUMER_OFFSETS_TOPIC, p, plain)
        internal.append(CONSUMER_OFFSETS_TOPIC, p, [encode_record(GroupMetadataKey(group), metadata)])
        for pid, offset, partition in (
            (COMMITTED, 100, 5),
            (ABORTED, 200, 7),
            (COMMITTED, 250, 8),
            (OPEN, 300, 9),
        ):
            txn = [
                commit(group, "in", partition, OffsetCommitValue(offset=offset + i, commit_timestamp=7), 3)
            ]
            internal.append(
                CONSUMER_OFFSETS_TOPIC, p, txn, producer_id=pid, producer_epoch=0, transactional=True
            )
        # a later plain commit to a partition the COMMITTED transaction also wrote (log order wins)
        internal.append(CONSUMER_OFFSETS_TOPIC, p, [commit(group, "in", 5, OffsetCommitValue(offset=150), 3)])
        # a tombstone for one offset, a record type not ours (KIP-848), bad UTF-8 in a key
        internal.append(
            CONSUMER_OFFSETS_TOPIC,
            p,
            [
                (encode_key(OffsetCommitKey(group, "in", 1)), None),
                (b"\x00\x05" + b"\x00\x03new", b"\x00\x00"),
                (
                    b"\x00\x01\x00\x02\xff\xfe\x00\x02in\x00\x00\x00\x00",
                    encode_offset_commit_value(OffsetCommitValue(offset=1), 3),
                ),
                (encode_key(OffsetCommitKey(group, "in", 6)), b"\x00\x03\x00"),  # truncated value
            ],
        )
    for p in range(PARTITIONS):
        tp = TopicPartition(CONSUMER_OFFSETS_TOPIC, p)
        internal.write_marker(tp, ControlType.COMMIT, COMMITTED, 0, 0)
        internal.write_marker(tp, ControlType.ABORT, ABORTED, 0, 0)
    # the last group's metadata deleted while its offsets remain (it becomes a simple Empty group)
    last = GROUPS[-1]
    internal.append(
        CONSUMER_OFFSETS_TOPIC, partition_for(last, PARTITIONS), [(encode_key(GroupMetadataKey(last)), None)]
    )


def state_of(coordinator: GroupCoordinator) -> dict[str, Any]:
    store = coordinator.offsets
    groups = {
        gid: (g.state, g.generation, g.protocol_type, g.protocol_name, g.leader_id, sorted(g.members))
        for gid, g in coordinator.membership.groups.items()
    }
    return {
        "committed": store._committed,
        "pending": store._pending,
        "staged": store._staged,
        "open": store._open,
        "groups": groups,
    }


def load(internal: object) -> GroupCoordinator:
    coordinator = GroupCoordinator(
        GroupCoordinatorConfig(num_partitions=PARTITIONS, initial_rebalance_delay_ms=0)
    )
    runtime = CoordinatorRuntime(
        "groups", CONSUMER_OFFSETS_TOPIC, cast(InternalTopics, internal), coordinator, skip_bad_records=True
    )
    runtime.load()
    return coordinator


@pytest.mark.parametrize("chunk", [None, 300], ids=["one-read", "many-reads"])
def test_fast_load_rebuilds_exactly_the_generic_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int | None
) -> None:
    """``many-reads``: the load reads a few batches at a time, so its walk resumes mid-log."""
    if chunk is not None:
        monkeypatch.setattr(internal_topics, "REPLAY_CHUNK", chunk)
    config = BrokerConfig.load(
        None,
        {
            "log.dirs": str(tmp_path),
            "log.cleaner.enable": "false",
            "offsets.topic.num.partitions": str(PARTITIONS),
        },
    )
    broker = Broker.open(config, tmp_path)
    try:
        write_mixed_log(broker.internal)
        fast = state_of(load(broker.internal))
        with monkeypatch.context() as patched:
            patched.setattr(coordinator_module, "decode_record", generic_decode_record)
            generic = state_of(load(GenericReplay(broker)))
    finally:
        broker.logs.close()
    assert fast == generic
    # the log exercised what it meant to: decided, aborted, open and overwritten offsets
    some = GROUPS[0]
    committed = fast["committed"][some]
    assert committed[("in", 5)].offset == 150  # the plain commit after the COMMITTED one wins
    assert ("in", 1) not in committed  # tombstoned
    assert {committed[("in", p)].offset for p in (2, 3, 4)} == {30, 40, 50}
    assert committed[("in", 8)].offset == 250  # COMMIT made it visible
    assert ("in", 7) not in committed and ("in", 9) not in committed  # ABORTED, still open
    assert set(fast["pending"]) == {OPEN}
    assert set(fast["groups"]) == set(GROUPS)
