"""What the kazoo shell's parts share: its errors, the values it returns, and multi-result checks.

:class:`~exactly.cluster.zk.ClusterZk` is assembled from parts by responsibility (session,
registration and controller election in ``zk``; topics in ``zk_topics``; partition states in
``zk_partitions``); each part reaches ZooKeeper only through the ``client`` declared by
:class:`ZkClientHolder`, and none of them holds state of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import RolledBackError

from exactly.cluster.znodes import PartitionState
from exactly.controller.decisions import StateChange


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


class ZkClientHolder:
    """The one attribute every part of the shell uses: the session's kazoo client."""

    client: KazooClient


def first_failure(results: list[Any]) -> Exception | None:
    return next((r for r in results if isinstance(r, Exception) and not isinstance(r, RolledBackError)), None)


def raise_first_failure(results: list[Any], path: str) -> None:
    failure = first_failure(results)
    if failure is not None:
        raise ClusterZkError(f"{path}: {failure!r}") from failure
