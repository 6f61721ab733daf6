"""The contract between a sans-IO coordinator and the runtime that drives it (Kafka's
``CoordinatorShard``).

A coordinator keeps the state of the internal-topic partitions it owns and changes it only by
replaying that topic's records: at load time from the log, and live from the completion of its
own writes (see :mod:`exactly.coordinator.result`). The runtime needs just these calls:

* :meth:`CoordinatorShard.replay` / :meth:`CoordinatorShard.replay_end_transaction` -- one record
  or one COMMIT/ABORT marker of the topic, in log order, while loading;
* :meth:`CoordinatorShard.load_complete` -- loading is over; the result holds what the loaded
  state still owes (session timers to start, transaction markers to re-send);
* :meth:`CoordinatorShard.unload` -- the coordinator stops owning the topic: it answers its
  parked requests (NOT_COORDINATOR) and forgets its state; a later load replays again;
* :meth:`CoordinatorShard.next_deadline` / :meth:`CoordinatorShard.poll` -- the coordinator's
  timers: the runtime calls ``poll`` at or after the deadline.

Requests are ordinary methods of each coordinator returning a ``CoordinatorResult``; the runtime
runs them through ``call``/``drive`` and does not need to know them.

One coordinator object owns the partitions of its topic that the runtime hands it: every
partition on a single broker; on a cluster the ones this broker leads, reloaded as a whole
(``unload``, replay of the led partitions, ``load_complete``) when that set changes. Keeping one
coordinator per led partition instead needs no change here either: the contract is already per
record and per partition.
"""

from __future__ import annotations

from typing import Any, Protocol

from exactly.coordinator.result import CoordinatorResult


class CoordinatorShard(Protocol):
    """What the runtime calls on a coordinator besides its requests (see the module docstring)."""

    def replay(self, key: bytes, value: bytes | None, *, offset: int, producer_id: int) -> None:
        """Apply one record (value None = tombstone); ``producer_id`` >= 0 only for records of a
        transactional batch, which stay pending until their marker."""

    def replay_end_transaction(self, producer_id: int, commit: bool, partition: int | None = None) -> None:
        """Apply a COMMIT (True) / ABORT marker of ``producer_id`` found on ``partition``."""

    def load_complete(self, now_ms: int) -> CoordinatorResult[Any]:
        """Every record is replayed: start serving; the result is what the loaded state owes."""

    def unload(self, now_ms: int) -> CoordinatorResult[Any]:
        """Stop owning the topic: answer parked requests, forget all state."""

    def next_deadline(self) -> int | None:
        """When :meth:`poll` next has work (absolute ms), or None."""

    def poll(self, now_ms: int) -> CoordinatorResult[Any]:
        """Fire every timer due at ``now_ms``."""
