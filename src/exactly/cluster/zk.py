"""The kazoo shell: every ZooKeeper read and write of the cluster mode, and nothing else.

Decisions live in ``exactly.controller`` and ``exactly.replication``; this shell applies them with
ZooKeeper's conditional operations, which are what make them safe. :class:`ClusterZk` is this
module (session, registration, controller election, broker set) plus two parts it inherits:
``zk_topics`` (cluster id, topics) and ``zk_partitions`` (state znodes, ISR writes); the shared
errors and values are in ``zk_base``.

* **Broker registration**: the ephemeral ``/brokers/ids/<id>``, created as Kafka does (one multi:
  create with empty data, then setData at version 0). Its czxid is the **broker epoch**. If the
  session is lost (kazoo's ``LOST``: it expired, ephemerals are gone), the broker registers again
  as soon as a new session is up, gets a new broker epoch, and ``on_registered`` tells it so that
  it re-reads everything (the controller sees a bounce).
* **Controller election** (:meth:`ClusterZk.elect_controller`): one multi creates the ephemeral
  ``/controller`` and sets ``/controller_epoch`` to old+1 *at the version just read*. The winner
  keeps the new version of ``/controller_epoch`` (:class:`ControllerLease`); **every** later
  controller write is a multi that starts with a check of that version, so a deposed controller
  that is still running cannot change anything (:class:`ControllerMovedError`).
* **Partition state**: the controller creates/sets state znodes in fenced multis at the zkVersion
  its decision was computed against; a partition leader changes only the ISR, with a conditional
  set at the zkVersion it holds and adopts the result only on success.
* **Producer ids**: :class:`ZkProducerIdManager`, blocks of 1000 from ``/latest_producer_id_block``.

Threading: kazoo runs callbacks (watches, state listeners) on its own threads. This class never
blocks inside a listener; re-registration runs on kazoo's handler via ``spawn``. Callers that live
on the asyncio loop must hop threads (``loop.call_soon_threadsafe``) when they receive a callback.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError

from exactly.cluster import znodes as zn
from exactly.cluster.zk_base import (
    BrokerIdInUseError,
    ClusterZkError,
    ControllerLease,
    ControllerMovedError,
    ObservedState,
    StateWriteResult,
    TopicExistsError,
    ensure_path,
    raise_first_failure,
    split_connect,
)
from exactly.cluster.zk_partitions import ZkPartitionStates
from exactly.cluster.zk_topics import ZkTopics
from exactly.cluster.znodes import BrokerRegistration, ControllerRegistration

# The errors and values callers know from this module (they live in ``zk_base``, shared by parts).
__all__ = [
    "DEFAULT_SESSION_TIMEOUT_MS",
    "BrokerIdInUseError",
    "ClusterZk",
    "ClusterZkError",
    "ControllerLease",
    "ControllerMovedError",
    "ObservedState",
    "StateWriteResult",
    "TopicExistsError",
    "split_connect",
]

log = logging.getLogger(__name__)

DEFAULT_SESSION_TIMEOUT_MS = 18_000  # zookeeper.session.timeout.ms


class ClusterZk(ZkTopics, ZkPartitionStates):
    """One broker's ZooKeeper session (``zookeeper.connect`` with an optional chroot): session,
    registration and controller election here; topic and partition-state operations from the
    parts it inherits (``zk_topics``, ``zk_partitions``)."""

    def __init__(
        self,
        connect: str,
        *,
        session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS,
        connection_timeout_s: float = 10.0,
    ) -> None:
        self.connect = connect
        self.hosts, self.chroot = split_connect(connect)
        self.session_timeout_ms = session_timeout_ms
        self.connection_timeout_s = connection_timeout_s
        self.client = KazooClient(hosts=connect, timeout=session_timeout_ms / 1000)
        self._registration: BrokerRegistration | None = None
        self._session_lost = False
        self._lock = threading.Lock()
        self.broker_epoch: int | None = None
        # Called (on a kazoo thread) with the new broker epoch after every (re-)registration.
        self.on_registered: Callable[[int], None] | None = None

    # --- session -------------------------------------------------------------------------------

    def start(self) -> None:
        if self.chroot:
            root = KazooClient(hosts=self.hosts, timeout=self.session_timeout_ms / 1000)
            root.start(self.connection_timeout_s)
            try:
                ensure_path(root, self.chroot)
            finally:
                root.stop()
                root.close()
        self.client.add_listener(self._on_state)
        self.client.start(self.connection_timeout_s)
        for path in zn.PERSISTENT_PATHS:
            ensure_path(self.client, path)

    def stop(self) -> None:
        """Close the session: ephemerals (registration, /controller) disappear at once."""
        self.client.remove_listener(self._on_state)
        self.client.stop()
        self.client.close()

    @property
    def session_id(self) -> int:
        client_id = self.client.client_id
        return int(client_id[0]) if client_id else 0

    def _on_state(self, state: str) -> None:
        if state == KazooState.LOST:
            log.warning("ZooKeeper session lost: ephemeral znodes are gone, will register again")
            with self._lock:
                self._session_lost = True
        elif state == KazooState.CONNECTED:
            with self._lock:
                lost, self._session_lost = self._session_lost, False
            if lost and self._registration is not None:
                self.client.handler.spawn(self._reregister)

    def _reregister(self) -> None:
        registration = self._registration
        if registration is None:
            return
        deadline = time.monotonic() + 2 * self.session_timeout_ms / 1000
        while True:
            try:
                self.register_broker(registration)
                return
            except BrokerIdInUseError:
                if time.monotonic() > deadline:
                    log.error("broker %d: id still registered by another session", registration.broker_id)
                    return
                time.sleep(0.2)
            except Exception:  # connection dropped again: the next CONNECTED after LOST retries
                log.exception("broker %d: re-registration failed", registration.broker_id)
                return

    # --- broker registration -------------------------------------------------------------------

    def register_broker(self, registration: BrokerRegistration) -> int:
        """Create ``/brokers/ids/<id>``; return the broker epoch (its czxid)."""
        path = zn.broker_path(registration.broker_id)
        data = registration.encode()
        tx = self.client.transaction()
        tx.create(path, b"", ephemeral=True)
        tx.set_data(path, data, version=0)
        results = tx.commit()
        if isinstance(results[0], NodeExistsError):
            stat = self.client.exists(path)
            if stat is None:  # expired between the two calls: try again
                return self.register_broker(registration)
            if stat.ephemeralOwner != self.session_id:
                raise BrokerIdInUseError(
                    f"broker id {registration.broker_id} is registered by session {stat.ephemeralOwner:#x}"
                )
            epoch = int(stat.czxid)  # our own node (a retried call)
        else:
            raise_first_failure(results, path)
            stat = self.client.exists(path)
            if stat is None:
                raise ClusterZkError(f"{path} vanished right after its creation")
            epoch = int(stat.czxid)
        self._registration = registration
        self.broker_epoch = epoch
        log.info("broker %d registered with broker epoch %d", registration.broker_id, epoch)
        if self.on_registered is not None:
            self.on_registered(epoch)
        return epoch

    def live_brokers(self) -> dict[int, int]:
        """Broker id -> broker epoch (czxid) of every registered broker."""
        brokers: dict[int, int] = {}
        for child in self.client.get_children(zn.BROKER_IDS):
            stat = self.client.exists(f"{zn.BROKER_IDS}/{child}")
            if stat is not None and child.isdigit():
                brokers[int(child)] = int(stat.czxid)
        return brokers

    def broker_registration(self, broker_id: int) -> BrokerRegistration | None:
        try:
            data, _stat = self.client.get(zn.broker_path(broker_id))
        except NoNodeError:
            return None
        return BrokerRegistration.decode(broker_id, data)

    # --- controller election -------------------------------------------------------------------

    def controller_id(self) -> int | None:
        try:
            data, _stat = self.client.get(zn.CONTROLLER)
        except NoNodeError:
            return None
        return ControllerRegistration.decode(data).broker_id

    def controller_epoch(self) -> tuple[int, int]:
        """(epoch, stat version) of ``/controller_epoch``, creating it at 0 when missing."""
        try:
            data, stat = self.client.get(zn.CONTROLLER_EPOCH)
        except NoNodeError:
            try:
                self.client.create(zn.CONTROLLER_EPOCH, zn.encode_controller_epoch(0))
            except NodeExistsError:
                pass
            data, stat = self.client.get(zn.CONTROLLER_EPOCH)
        return zn.decode_controller_epoch(data), int(stat.version)

    def elect_controller(self, broker_id: int, now_ms: int | None = None) -> ControllerLease | None:
        """Try once to become controller; None if another broker holds ``/controller``."""
        epoch, version = self.controller_epoch()
        timestamp = now_ms if now_ms is not None else int(time.time() * 1000)
        tx = self.client.transaction()
        tx.create(zn.CONTROLLER, ControllerRegistration(broker_id, timestamp).encode(), ephemeral=True)
        tx.set_data(zn.CONTROLLER_EPOCH, zn.encode_controller_epoch(epoch + 1), version=version)
        results = tx.commit()
        if not any(isinstance(r, Exception) for r in results):
            stat = results[1]
            lease = ControllerLease(broker_id, epoch + 1, int(stat.version))
            log.info("broker %d is controller with epoch %d", broker_id, lease.epoch)
            return lease
        # NODEEXISTS or BADVERSION: someone else won, unless an earlier attempt of ours did.
        current, current_version = self.controller_epoch()
        try:
            _data, stat = self.client.get(zn.CONTROLLER)
        except NoNodeError:
            return None
        if self.controller_id() == broker_id and stat.ephemeralOwner == self.session_id:
            return ControllerLease(broker_id, current, current_version)
        return None

    def watch_controller(self, callback: Callable[[int | None], None]) -> None:
        """``callback(controller id or None)`` now and on every change of ``/controller`` (on a
        kazoo thread). Brokers run an election when it becomes None."""

        def on_change(data: bytes | None, _stat: Any) -> None:
            callback(ControllerRegistration.decode(data).broker_id if data else None)

        self.client.DataWatch(zn.CONTROLLER, on_change)

    def resign_controller(self, lease: ControllerLease) -> None:
        """Delete ``/controller`` if it is still ours (fenced by the epoch version)."""
        tx = self.client.transaction()
        tx.check(zn.CONTROLLER_EPOCH, lease.epoch_zk_version)
        tx.delete(zn.CONTROLLER)
        tx.commit()

    def watch_brokers(self, callback: Callable[[dict[int, int]], None]) -> None:
        """``callback(live broker id -> broker epoch)`` now and after every change of
        ``/brokers/ids`` (the controller diffs consecutive maps with ``diff_brokers``)."""

        def on_children(_children: list[str]) -> None:
            try:
                live = self.live_brokers()
            except KazooException as exc:  # the session is going away; a new watch re-reads
                log.debug("broker set not read: %r", exc)
                return
            callback(live)

        self.client.ChildrenWatch(zn.BROKER_IDS, on_children)
