"""Typed identifiers shared by every layer.

NewTypes cost nothing at run time but let mypy catch a producer epoch passed where a sequence
was meant. Kafka's sentinels are kept with their Kafka names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NewType

from exactly.frozen import quick_init

ProducerId = NewType("ProducerId", int)
ProducerEpoch = NewType("ProducerEpoch", int)
Offset = NewType("Offset", int)

NO_PRODUCER_ID = ProducerId(-1)
NO_PRODUCER_EPOCH = ProducerEpoch(-1)

# Epochs are int16 on the wire; the coordinator hands out a new producer id when this is reached.
MAX_PRODUCER_EPOCH = 32767


@quick_init
@dataclass(frozen=True, slots=True)
class TopicPartition:
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"
