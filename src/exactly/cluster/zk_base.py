"""What the kazoo shell's parts share: its errors, the values it returns, and multi-result checks.

:class:`~exactly.cluster.zk.ClusterZk` is assembled from parts by responsibility (session,
registration and controller election in ``zk``; topics in ``zk_topics``; partition states in
``zk_partitions``); each part reaches ZooKeeper only through the ``client`` declared by
:class:`ZkClientHolder`, and none of them holds state of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import RolledBackError
from kazoo.retry import KazooRetry

from exactly.cluster.znodes import PartitionState
from exactly.controller.decisions import StateChange

T = TypeVar("T")


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


# How long a start-up ZooKeeper call keeps retrying through a lost connection: longer than a
# session (a broker restarted after kill -9 may meet ZooKeeper dropping it, under load, while its
# previous session expires), short enough that a ZooKeeper that is really gone still stops the
# start with an error rather than a hang.
STARTUP_RETRY_DEADLINE_S = 60.0
ENSURE_PATH_DEADLINE_S = STARTUP_RETRY_DEADLINE_S


def call_with_retry(
    client: KazooClient,
    func: Callable[..., T],
    *args: Any,
    deadline_s: float = STARTUP_RETRY_DEADLINE_S,
    **kwargs: Any,
) -> T:
    """``func(*args, **kwargs)``, called again after ConnectionLoss, OperationTimeout and session
    expiry (kazoo's ``KazooRetry``: 0.1 s back-off doubling up to 1 s, until ``deadline_s``);
    any other error is raised at once.

    Why: a plain kazoo call raises on the first lost connection, and the broker's start-up makes
    its calls from the executor that registers the broker and starts its watches: one dropped
    connection at load ~18 made a restarting broker exit with code 1 before it listened
    (``bench/results/txnbounce-s19.md``). Kafka's ``KafkaZkClient`` retries its requests until
    the connection is back. The watch recipes retry on their own (``client.retry``).

    Contract for ``func``: calling it again after an attempt whose outcome is unknown (the
    request may have been applied before the connection dropped) must be correct: a read, an
    ``ensure_path``, a create that treats NODEEXISTS as "read what is there", a conditional set
    that re-reads on BADVERSION."""
    retry = KazooRetry(
        max_tries=-1,
        delay=0.1,
        backoff=2,
        max_delay=1.0,
        deadline=deadline_s,
        sleep_func=client.handler.sleep_func,
    )
    return retry(func, *args, **kwargs)  # type: ignore[no-any-return]


def ensure_path(client: KazooClient, path: str, deadline_s: float = ENSURE_PATH_DEADLINE_S) -> None:
    """``client.ensure_path(path)`` through :func:`call_with_retry` (it is idempotent)."""
    call_with_retry(client, client.ensure_path, path, deadline_s=deadline_s)
