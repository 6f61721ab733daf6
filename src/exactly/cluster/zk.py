"""The kazoo shell: every ZooKeeper read and write of the cluster mode, and nothing else.

Decisions live in ``exactly.controller`` and ``exactly.replication``; this module applies them with
ZooKeeper's conditional operations, which are what make them safe:

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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
)

from exactly.cluster import znodes as zn
from exactly.cluster.znodes import (
    BrokerRegistration,
    ControllerRegistration,
    LeaderAndIsr,
    PartitionState,
    TopicAssignment,
)
from exactly.controller.decisions import NEW_ZNODE, StateChange
from exactly.types import TopicPartition

log = logging.getLogger(__name__)

DEFAULT_SESSION_TIMEOUT_MS = 18_000  # zookeeper.session.timeout.ms


class ClusterZkError(Exception):
    pass


class BrokerIdInUseError(ClusterZkError):
    """``/brokers/ids/<id>`` exists and belongs to another session (another broker with the same
    id, or this broker's previous incarnation whose session has not expired yet)."""


class ControllerMovedError(ClusterZkError):
    """The ``/controller_epoch`` check failed: this broker is no longer the controller."""


class TopicExistsError(ClusterZkError):
    pass


def split_connect(connect: str) -> tuple[str, str]:
    """``host:port[,host:port]/chroot`` -> (hosts, chroot or '')."""
    hosts, slash, chroot = connect.partition("/")
    return hosts, (slash + chroot).rstrip("/") if chroot else ""


@dataclass(frozen=True, slots=True)
class ControllerLease:
    """This broker won the election at ``epoch``; ``epoch_zk_version`` is the stat version of
    ``/controller_epoch`` every fenced write checks."""

    broker_id: int
    epoch: int
    epoch_zk_version: int


@dataclass(frozen=True, slots=True)
class ObservedState:
    """A state znode as read, with what the role decisions need from its stat."""

    state: PartitionState
    modified_zxid: int


@dataclass(frozen=True, slots=True)
class StateWriteResult:
    change: StateChange
    new_zk_version: int | None  # None: BADVERSION/NONODE/NODEEXISTS, re-read and decide again


class ClusterZk:
    """One broker's ZooKeeper session (``zookeeper.connect`` with an optional chroot)."""

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
                root.ensure_path(self.chroot)
            finally:
                root.stop()
                root.close()
        self.client.add_listener(self._on_state)
        self.client.start(self.connection_timeout_s)
        for path in zn.PERSISTENT_PATHS:
            self.client.ensure_path(path)

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
            _raise_first_failure(results, path)
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

    # --- cluster id ----------------------------------------------------------------------------

    def get_or_create_cluster_id(self, candidate: str) -> str:
        """The cluster's id from ``/cluster/id``; the first broker to start writes ``candidate``."""
        try:
            data, _stat = self.client.get(zn.CLUSTER_ID)
            return zn.decode_cluster_id(data)
        except NoNodeError:
            pass
        self.client.ensure_path("/cluster")
        try:
            self.client.create(zn.CLUSTER_ID, zn.encode_cluster_id(candidate))
            return candidate
        except NodeExistsError:
            data, _stat = self.client.get(zn.CLUSTER_ID)
            return zn.decode_cluster_id(data)

    # --- topics --------------------------------------------------------------------------------

    def create_topic(self, topic: str, assignment: TopicAssignment, config: dict[str, str]) -> None:
        """Config first, then the assignment (the controller reacts to the latter), as Kafka."""
        if self.client.exists(zn.topic_path(topic)) is not None:
            raise TopicExistsError(topic)
        self.client.ensure_path(zn.CONFIG_TOPICS)
        try:
            self.client.create(zn.topic_config_path(topic), zn.encode_topic_config(config))
        except NodeExistsError:
            self.client.set(zn.topic_config_path(topic), zn.encode_topic_config(config))
        try:
            self.client.create(zn.topic_path(topic), assignment.encode())
        except NodeExistsError as exc:
            raise TopicExistsError(topic) from exc

    def mark_topic_for_deletion(self, topic: str) -> None:
        """DeleteTopics: create ``/admin/delete_topics/<t>``; the controller does the rest."""
        try:
            self.client.create(zn.delete_topic_path(topic), b"")
        except NodeExistsError:
            pass

    def topics_to_delete(self) -> list[str]:
        return sorted(self.client.get_children(zn.ADMIN_DELETE_TOPICS))

    def watch_topic_deletions(self, callback: Callable[[list[str]], None]) -> None:
        self.client.ChildrenWatch(zn.ADMIN_DELETE_TOPICS, lambda topics: callback(sorted(topics)))

    def delete_topic(self, lease: ControllerLease, topic: str) -> None:
        """The controller's last step of a deletion: the state znodes, the assignment, the config
        and the marker go in one multi fenced by ``/controller_epoch``. Brokers watching
        ``/brokers/topics`` then delete their replicas. Raises :class:`ControllerMovedError`."""
        doomed = self._subtree(zn.topic_path(topic))
        if self.client.exists(zn.topic_config_path(topic)) is not None:
            doomed.append(zn.topic_config_path(topic))
        doomed.append(zn.delete_topic_path(topic))
        tx = self.client.transaction()
        tx.check(zn.CONTROLLER_EPOCH, lease.epoch_zk_version)
        for path in doomed:
            tx.delete(path)
        outcome = tx.commit()
        if isinstance(outcome[0], BadVersionError | NoNodeError):
            raise ControllerMovedError(f"controller epoch {lease.epoch} is no longer current")
        failure = _first_failure(outcome)
        if failure is not None:
            log.info(
                "deletion of topic %s raced with another change (%r); retried on the next event",
                topic,
                failure,
            )
            return
        log.info("controller epoch %d: deleted topic %s", lease.epoch, topic)

    def _subtree(self, path: str) -> list[str]:
        """``path`` and everything below it, children before parents (delete order)."""
        try:
            children = self.client.get_children(path)
        except NoNodeError:
            return []
        out: list[str] = []
        for child in children:
            out.extend(self._subtree(f"{path}/{child}"))
        out.append(path)
        return out

    def topics(self) -> list[str]:
        return sorted(self.client.get_children(zn.BROKER_TOPICS))

    def topic_config(self, topic: str) -> dict[str, str]:
        """The overrides in ``/config/topics/<t>`` ({} when missing)."""
        try:
            data, _stat = self.client.get(zn.topic_config_path(topic))
        except NoNodeError:
            return {}
        return zn.decode_topic_config(data)

    def topic_assignment(self, topic: str) -> TopicAssignment | None:
        try:
            data, _stat = self.client.get(zn.topic_path(topic))
        except NoNodeError:
            return None
        return TopicAssignment.decode(topic, data)

    def topic_assignment_at(self, topic: str) -> tuple[TopicAssignment, int] | None:
        """The assignment with its stat version, for a conditional rewrite (CreatePartitions)."""
        try:
            data, stat = self.client.get(zn.topic_path(topic))
        except NoNodeError:
            return None
        return TopicAssignment.decode(topic, data), int(stat.version)

    def set_topic_assignment(self, topic: str, assignment: TopicAssignment, expected_version: int) -> bool:
        """CreatePartitions' rewrite of ``/brokers/topics/<t>``, conditional on the version the new
        assignment was computed from (Kafka writes it unconditionally; two admin requests racing
        on different brokers must not overwrite each other's partitions). False when the znode
        moved or went: re-read and decide again."""
        try:
            self.client.set(zn.topic_path(topic), assignment.encode(), version=expected_version)
        except (BadVersionError, NoNodeError):
            return False
        return True

    def topic_marked_for_deletion(self, topic: str) -> bool:
        return self.client.exists(zn.delete_topic_path(topic)) is not None

    def watch_topic_assignment(
        self, topic: str, callback: Callable[[TopicAssignment | None], bool | None]
    ) -> None:
        """``callback`` now and after every change of ``/brokers/topics/<t>`` (None while it does
        not exist; a re-created topic fires again), on a kazoo thread; it ends when the callback
        returns False. An unreadable assignment is logged and skipped."""

        def on_change(data: bytes | None, _stat: Any) -> bool | None:
            if data is None:
                return callback(None)
            try:
                assignment = TopicAssignment.decode(topic, data)
            except zn.ZnodeFormatError as exc:
                log.warning("topic %s assignment unreadable: %s", topic, exc)
                return True
            return callback(assignment)

        self.client.DataWatch(zn.topic_path(topic), on_change)

    # --- partition state -----------------------------------------------------------------------

    def partition_state(self, tp: TopicPartition) -> ObservedState | None:
        try:
            data, stat = self.client.get(zn.partition_state_path(tp.topic, tp.partition))
        except NoNodeError:
            return None
        what = f"{tp} state"
        return ObservedState(
            PartitionState(LeaderAndIsr.decode(data, what), int(stat.version)), int(stat.mzxid)
        )

    def watch_partition_state(
        self, tp: TopicPartition, callback: Callable[[ObservedState | None], bool | None]
    ) -> None:
        """``callback`` now and after every change of the state znode (None while it does not
        exist), on a kazoo thread. A one-shot watch re-armed by kazoo: changes in between may merge,
        which the role decisions tolerate because they compare epochs. The watch ends when the
        callback returns False (the topic was deleted and is no longer of interest)."""

        def on_change(data: bytes | None, stat: Any) -> bool | None:
            if data is None or stat is None:
                return callback(None)
            state = PartitionState(LeaderAndIsr.decode(data, f"{tp} state"), int(stat.version))
            return callback(ObservedState(state, int(stat.mzxid)))

        self.client.DataWatch(zn.partition_state_path(tp.topic, tp.partition), on_change)

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

    def watch_topics(self, callback: Callable[[list[str]], None]) -> None:
        """``callback(topic names)`` now and after every change of ``/brokers/topics``."""
        self.client.ChildrenWatch(zn.BROKER_TOPICS, lambda topics: callback(sorted(topics)))

    def write_partition_states(
        self, lease: ControllerLease, changes: Iterable[StateChange]
    ) -> list[StateWriteResult]:
        """Apply controller decisions, each in a multi fenced by ``/controller_epoch``'s version.
        Raises :class:`ControllerMovedError` at the first failed fence (nothing after it is tried)."""
        results: list[StateWriteResult] = []
        for change in changes:
            path = zn.partition_state_path(change.tp.topic, change.tp.partition)
            tx = self.client.transaction()
            tx.check(zn.CONTROLLER_EPOCH, lease.epoch_zk_version)
            if change.expected_zk_version == NEW_ZNODE:
                for parent in (
                    zn.partitions_path(change.tp.topic),
                    zn.partition_path(change.tp.topic, change.tp.partition),
                ):
                    if self.client.exists(parent) is None:
                        tx.create(parent, b"")  # (Kafka writes these with no data too)
                tx.create(path, change.new.encode())
            else:
                tx.set_data(path, change.new.encode(), version=change.expected_zk_version)
            outcome = tx.commit()
            if isinstance(outcome[0], BadVersionError | NoNodeError):
                raise ControllerMovedError(f"controller epoch {lease.epoch} is no longer current")
            if any(isinstance(r, Exception) for r in outcome):
                log.info(
                    "%s: %s not applied (%s), state changed meanwhile",
                    change.tp,
                    change.reason.value,
                    _first_failure(outcome),
                )
                results.append(StateWriteResult(change, None))
                continue
            new_version = 0 if change.expected_zk_version == NEW_ZNODE else int(outcome[-1].version)
            results.append(StateWriteResult(change, new_version))
        return results

    def update_isr(self, tp: TopicPartition, new: LeaderAndIsr, expected_zk_version: int) -> int | None:
        """A partition leader's ISR write (Kafka's pre-AlterPartition path): conditional on the
        zkVersion it holds, no controller fence (the leader is not the controller). Returns the
        new zkVersion, or None on BADVERSION/NONODE: then the leader must not adopt the ISR."""
        path = zn.partition_state_path(tp.topic, tp.partition)
        try:
            stat = self.client.set(path, new.encode(), version=expected_zk_version)
        except (BadVersionError, NoNodeError):
            log.info("%s: cached zkVersion %d is stale, ISR change not adopted", tp, expected_zk_version)
            return None
        return int(stat.version)


def _first_failure(results: list[Any]) -> Exception | None:
    return next((r for r in results if isinstance(r, Exception) and not isinstance(r, RolledBackError)), None)


def _raise_first_failure(results: list[Any], path: str) -> None:
    failure = _first_failure(results)
    if failure is not None:
        raise ClusterZkError(f"{path}: {failure!r}") from failure
