"""The console's snapshot of a cluster, and the rules that call a transaction hanging.

A :class:`Snapshot` is taken in one go (:mod:`exactly.webconsole.gather`) and is immutable: the
page, the JSON endpoint and the tests all read the same records. Every section may be missing
with an entry in ``errors`` instead (a broker that does not offer DescribeProducers, a group
coordinator that times out): one failing admin call never hides what the others found.

Hanging, as the page highlights it, has two forms:

* a **transaction** the coordinator tracks is *overdue* when it has been open longer than its
  own ``transaction.timeout.ms`` (the coordinator should already have aborted it) or longer than
  the console's threshold (``--hanging-after-ms``, default Kafka's ``transaction.max.timeout.ms``:
  no healthy transaction lives that long);
* a **partition** holds an *orphan* open transaction (KIP-664's hanging transaction) when a
  producer has an open transaction there (DescribeProducers: a first offset) that no coordinator
  expects to end there: its producer id is unknown to every coordinator, or the id's open
  transaction does not include the partition. Its first offset holds the LSO back forever.
  Kafka's ``find-hanging`` guards against a transaction that began or ended between its two
  looks by an age threshold; the console instead asks the partition again after asking the
  coordinators and keeps only what is still open at the same first offset (see
  :mod:`exactly.webconsole.gather`), so an orphan shows at once, whatever its age.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

OPEN_STATES = frozenset({"Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence"})
DEFAULT_HANGING_AFTER_MS = 900_000  # Kafka's transaction.max.timeout.ms


@dataclass(frozen=True, slots=True)
class Broker:
    broker_id: int
    host: str
    port: int
    is_controller: bool


@dataclass(frozen=True, slots=True)
class Producer:
    """One DescribeProducers entry; ``txn_start_offset`` -1 when no transaction is open."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp_ms: int
    coordinator_epoch: int
    txn_start_offset: int
    orphan: bool  # an open transaction here that no coordinator will end (see module docstring)


@dataclass(frozen=True, slots=True)
class Partition:
    """``lso`` is the read_committed end (ListOffsets latest, isolation 1), ``high_watermark``
    the read_uncommitted one; -1 when unknown. ``lso_lag`` is Kafka's LastStableOffsetLag."""

    topic: str
    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    high_watermark: int
    lso: int
    producers: tuple[Producer, ...]

    @property
    def lso_lag(self) -> int:
        if self.high_watermark < 0 or self.lso < 0:
            return -1
        return self.high_watermark - self.lso


@dataclass(frozen=True, slots=True)
class Transaction:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: str
    timeout_ms: int
    start_time_ms: int  # -1 when no transaction has started
    age_ms: int  # -1 unless open
    partitions: tuple[tuple[str, int], ...]
    hanging_reason: str  # "" unless overdue (see module docstring)

    @property
    def is_open(self) -> bool:
        return self.state in OPEN_STATES


@dataclass(frozen=True, slots=True)
class GroupOffset:
    """A committed offset and its lag against the partition's LSO: what a read_committed member
    still has to read (-1 when the LSO or the offset is unknown)."""

    topic: str
    partition: int
    committed: int
    lso: int
    lag: int
    member: str


@dataclass(frozen=True, slots=True)
class GroupMember:
    member_id: str
    client_id: str
    host: str
    partitions: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class Group:
    group_id: str
    state: str
    coordinator: int
    members: tuple[GroupMember, ...]
    offsets: tuple[GroupOffset, ...]

    @property
    def total_lag(self) -> int:
        return sum(o.lag for o in self.offsets if o.lag >= 0)


@dataclass(frozen=True, slots=True)
class Snapshot:
    bootstrap: str
    taken_at_ms: int
    hanging_after_ms: int
    cluster_id: str | None
    controller_id: int
    brokers: tuple[Broker, ...]
    partitions: tuple[Partition, ...]
    transactions: tuple[Transaction, ...]
    groups: tuple[Group, ...]
    errors: tuple[str, ...]

    @property
    def hanging_count(self) -> int:
        orphans = sum(1 for p in self.partitions for q in p.producers if q.orphan)
        return orphans + sum(1 for t in self.transactions if t.hanging_reason)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON types; the derived values (LSO lag, open, total lag) are included so a
        script need not recompute them."""
        out = dataclasses.asdict(self)
        for raw, p in zip(out["partitions"], self.partitions):
            raw["lso_lag"] = p.lso_lag
        for raw, t in zip(out["transactions"], self.transactions):
            raw["open"] = t.is_open
        for raw, g in zip(out["groups"], self.groups):
            raw["total_lag"] = g.total_lag
        out["hanging_count"] = self.hanging_count
        return out


# ---------------------------------------------------------------------- rules
def overdue_reason(state: str, timeout_ms: int, age_ms: int, hanging_after_ms: int) -> str:
    """Why an open transaction counts as hanging, or "" (see the module docstring)."""
    if state not in OPEN_STATES or age_ms < 0:
        return ""
    if timeout_ms > 0 and age_ms > timeout_ms:
        return f"open {age_ms} ms, past its {timeout_ms} ms timeout"
    if age_ms > hanging_after_ms:
        return f"open {age_ms} ms, longer than {hanging_after_ms} ms"
    return ""


def untracked(
    topic: str, partition: int, producer_id: int, txn_start_offset: int, transactions: Iterable[Transaction]
) -> bool:
    """Whether a producer's open transaction on a partition (``txn_start_offset`` >= 0) is one
    no coordinator's open transaction includes: an orphan, if it is still open when asked again."""
    if txn_start_offset < 0:
        return False
    return not any(
        t.producer_id == producer_id and t.is_open and (topic, partition) in t.partitions
        for t in transactions
    )


def lag(committed: int, lso: int) -> int:
    """read_committed lag of a committed offset; -1 when either side is unknown."""
    if committed < 0 or lso < 0:
        return -1
    return max(lso - committed, 0)
