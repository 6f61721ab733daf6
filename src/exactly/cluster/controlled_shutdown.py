"""Controlled-shutdown requests in ZooKeeper: how a broker on SIGTERM asks the controller to move
its leaderships away, and how leaders learn which brokers are leaving.

Why a znode and not ControlledShutdown (API 7)
----------------------------------------------
Kafka's broker sends ControlledShutdown to the controller broker and retries while the answer
lists partitions it still leads. Our brokers learn everything else by watching ZooKeeper (see
the package README) and have no control-plane client; and Kafka's leaders additionally need to
know which brokers are shutting down, so that their ISR expansion does not take them back in
(KAFKA-14140: in Kafka the controller rejects that AlterPartition; here leaders write the ISR
themselves). One ephemeral znode per attempt serves both:

* ``/controlled_shutdown/<broker id>-<sequence>`` (ephemeral, sequential), data
  ``{"version":1,"broker":B,"broker_epoch":E}``. Each attempt of the shutting-down broker creates
  a new child, so the controller's children watch fires again for every attempt (Kafka's retry
  of the request; attempts are a back-off apart, and a merged notification is harmless since the
  controller reads every child); the controller handles every broker with a child whose broker epoch is the current
  one (an older epoch is Kafka's STALE_BROKER_EPOCH: ignored).
* Leaders watch the same children, with their data: a request marks its broker's registration
  (the broker epoch in it) as never ISR-eligible again (``replication.isr_eligibility``).
* The children are ephemeral, so they vanish with the broker's session, in the same transaction
  as its registration: the controller no longer considers it shutting down, and a restarted
  broker (a new session, a new broker epoch) is eligible again. Kafka's controller likewise
  forgets a shutting-down broker once it is gone. Leaders do not unmark a broker when its request
  vanishes, only when its registration is replaced: their two watches (requests, registrations)
  deliver the one transaction in either order, and "request gone, registration still there"
  would otherwise let a late Fetch of the leaving broker take it back into an ISR.

The path is ours, outside Kafka's layout (Kafka keeps this state in the controller's memory).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError

from exactly.cluster.zk_base import ensure_path
from exactly.cluster.znodes import ZnodeFormatError

log = logging.getLogger(__name__)

CONTROLLED_SHUTDOWN = "/controlled_shutdown"
REQUEST_VERSION = 1


@dataclass(frozen=True, slots=True)
class ShutdownRequest:
    broker_id: int
    broker_epoch: int  # the czxid of the broker's registration when it asked

    def encode(self) -> bytes:
        return json.dumps(
            {"version": REQUEST_VERSION, "broker": self.broker_id, "broker_epoch": self.broker_epoch},
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, data: bytes | None) -> ShutdownRequest:
        try:
            obj = json.loads(data or b"")
            broker, epoch = obj["broker"], obj["broker_epoch"]
        except (ValueError, TypeError, KeyError) as exc:
            raise ZnodeFormatError(f"controlled shutdown request: {data!r:.80}") from exc
        if not isinstance(broker, int) or not isinstance(epoch, int):
            raise ZnodeFormatError(f"controlled shutdown request: {data!r:.80}")
        return cls(broker, epoch)


def child_prefix(broker_id: int) -> str:
    return f"{CONTROLLED_SHUTDOWN}/{broker_id}-"


def broker_of_child(name: str) -> int | None:
    """``"3-0000000012"`` -> 3; None for a name that is not ours."""
    head, dash, seq = name.partition("-")
    if not dash or not head.isdigit() or not seq.isdigit():
        return None
    return int(head)


def in_effect(requests: Iterable[ShutdownRequest], live_brokers: Mapping[int, int]) -> frozenset[int]:
    """Brokers whose request is from their current incarnation (epoch = the live broker epoch)."""
    return frozenset(r.broker_id for r in requests if live_brokers.get(r.broker_id) == r.broker_epoch)


class ShutdownRequests:
    """The kazoo side: ask (the shutting-down broker), read (the controller), watch (both)."""

    def __init__(self, client: KazooClient) -> None:
        self.client = client

    def request(self, broker_id: int, broker_epoch: int) -> str:
        """One attempt: a new ephemeral sequential child. Returns its path."""
        self.client.ensure_path(CONTROLLED_SHUTDOWN)
        path: str = self.client.create(
            child_prefix(broker_id),
            ShutdownRequest(broker_id, broker_epoch).encode(),
            ephemeral=True,
            sequence=True,
        )
        return path

    def read(self) -> list[ShutdownRequest]:
        """Every pending request (unreadable children are logged and skipped)."""
        try:
            children = self.client.get_children(CONTROLLED_SHUTDOWN)
        except NoNodeError:
            return []
        return self._read_children(children)

    def _read_children(self, children: list[str]) -> list[ShutdownRequest]:
        """The requests named by ``children``; one gone meanwhile (its session ended, with its
        registration) is skipped, an unreadable one logged and skipped; other kazoo errors raise."""
        requests = []
        for name in sorted(children):
            if broker_of_child(name) is None:
                continue
            try:
                data, _stat = self.client.get(f"{CONTROLLED_SHUTDOWN}/{name}")
                requests.append(ShutdownRequest.decode(data))
            except NoNodeError:
                continue
            except ZnodeFormatError as exc:
                log.warning("%s/%s: %s", CONTROLLED_SHUTDOWN, name, exc)
        return requests

    def watch(self, callback: Callable[[frozenset[int]], None]) -> None:
        """``callback(ids of brokers with a request)`` now and after every change (kazoo thread).
        Ids only: whether a request is current is the controller's business (broker epochs)."""
        ensure_path(self.client, CONTROLLED_SHUTDOWN)

        def on_children(children: list[str]) -> None:
            ids = (broker_of_child(name) for name in children)
            callback(frozenset(b for b in ids if b is not None))

        self.client.ChildrenWatch(CONTROLLED_SHUTDOWN, on_children)

    def watch_requests(self, callback: Callable[[list[ShutdownRequest]], None]) -> None:
        """``callback(every pending request, with its broker epoch)`` now and after every change
        (kazoo thread): what leaders need, since a request marks its broker's registration as
        leaving for good (``replication.isr_eligibility``). One read per child, only when the
        children change (at shutdowns)."""
        ensure_path(self.client, CONTROLLED_SHUTDOWN)

        def on_children(children: list[str]) -> None:
            try:
                requests = self._read_children(children)
            except KazooException as exc:  # the session is going; a new watch re-reads
                log.debug("%s not read: %r", CONTROLLED_SHUTDOWN, exc)
                return
            callback(requests)

        self.client.ChildrenWatch(CONTROLLED_SHUTDOWN, on_children)
