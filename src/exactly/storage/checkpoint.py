"""Kafka's offset checkpoint format (recovery points), written crash-safely.

A checkpoint is rewritten whole through ``write_durably`` (storage/durable.py): after a crash a
reader sees either the old or the new content, never a mix; a stray ``*.tmp`` is garbage from an
interrupted write and is ignored.

Offset checkpoint files use Kafka's text layout (``OffsetCheckpointFile``)::

    0                 version
    2                 number of entries
    orders 0 1234     topic partition offset
    orders 1 987
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from exactly.storage.durable import write_durably
from exactly.types import TopicPartition

CHECKPOINT_VERSION = 0


def write_offset_checkpoint(path: Path, offsets: Mapping[TopicPartition, int]) -> None:
    lines = [str(CHECKPOINT_VERSION), str(len(offsets))]
    lines.extend(
        f"{tp.topic} {tp.partition} {offset}"
        for tp, offset in sorted(offsets.items(), key=lambda item: (item[0].topic, item[0].partition))
    )
    write_durably(path, ("\n".join(lines) + "\n").encode())


def read_offset_checkpoint(path: Path) -> dict[TopicPartition, int] | None:
    """The checkpointed offsets; None when the file is missing or malformed (callers then fall
    back to full recovery, which is slow but safe)."""
    try:
        lines = path.read_text().splitlines()
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    try:
        if int(lines[0]) != CHECKPOINT_VERSION:
            return None
        count = int(lines[1])
        entries = lines[2:]
        if len(entries) != count:
            return None
        result: dict[TopicPartition, int] = {}
        for line in entries:
            topic, partition, offset = line.rsplit(" ", 2)
            result[TopicPartition(topic, int(partition))] = int(offset)
    except (IndexError, ValueError):
        return None
    return result
