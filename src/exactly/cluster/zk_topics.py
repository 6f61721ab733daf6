"""The kazoo shell's topic part: the cluster id, topic creation and deletion, assignments, configs.

Writers: the admin path (CreateTopics / CreatePartitions / DeleteTopics handlers) and the
controller's final deletion multi, fenced by ``/controller_epoch`` like every controller write.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from exactly.cluster import znodes as zn
from exactly.cluster.zk_base import (
    STARTUP_RETRY_DEADLINE_S,
    ControllerLease,
    ControllerMovedError,
    TopicExistsError,
    ZkClientHolder,
    call_with_retry,
    first_failure,
)
from exactly.cluster.znodes import TopicAssignment

log = logging.getLogger(__name__)


class ZkTopics(ZkClientHolder):
    """Topic-level reads, writes and watches of :class:`~exactly.cluster.zk.ClusterZk`."""

    # --- cluster id ----------------------------------------------------------------------------

    def get_or_create_cluster_id(self, candidate: str, deadline_s: float = STARTUP_RETRY_DEADLINE_S) -> str:
        """The cluster's id from ``/cluster/id``; the first broker to start writes ``candidate``.

        A start-up call: retried through a lost connection (:func:`call_with_retry`, until
        ``deadline_s``). A retry is correct whatever the lost attempt did: it reads first, and
        a create that did succeed before the connection dropped meets NODEEXISTS (or the read)
        and answers the id that is there, which is ``candidate`` then (Kafka's
        ``createOrGetClusterId`` is the same create-or-read)."""
        return call_with_retry(self.client, self._get_or_create_cluster_id, candidate, deadline_s=deadline_s)

    def _get_or_create_cluster_id(self, candidate: str) -> str:
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
        failure = first_failure(outcome)
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

    def watch_topics(self, callback: Callable[[list[str]], None]) -> None:
        """``callback(topic names)`` now and after every change of ``/brokers/topics``."""
        self.client.ChildrenWatch(zn.BROKER_TOPICS, lambda topics: callback(sorted(topics)))
