"""The broker side of a controlled shutdown (SIGTERM in cluster mode): ask the controller to move
this broker's leaderships away, wait until they moved, then let the broker close.

Kafka's ``KafkaServer.controlledShutdown``: up to ``controlled.shutdown.max.retries`` attempts;
each sends ControlledShutdown to the controller and, while the answer still lists partitions,
sleeps ``controlled.shutdown.retry.backoff.ms``; when every attempt failed the broker goes on with
an unclean shutdown. Here an attempt is a request znode (``cluster.controlled_shutdown``) and the
answer is what this broker observes: its metadata cache, fed by the same ZooKeeper watches as
everything else, no longer shows it leading a partition someone else could take over nor in an
ISR next to others (``controller.decisions.controlled_shutdown_pending``). An attempt waits up to
the back-off for that, so the bound on the whole wait is Kafka's: retries x back-off.

While it waits the broker keeps serving: a produce to a partition whose leadership moved is
answered NOT_LEADER_OR_FOLLOWER (parked acks=all produces too, woken by the role change), and
the broker follows the new leaders until it exits, so its replicas stay complete.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from exactly.cluster.znodes import LeaderAndIsr
from exactly.controller.decisions import controlled_shutdown_pending
from exactly.types import TopicPartition

if TYPE_CHECKING:
    from exactly.server.replica_manager import ReplicaManager

log = logging.getLogger("exactly.controlled_shutdown")

REQUEST_TIMEOUT_S = 1.0  # at least this long for one request znode to be created


def remaining(manager: ReplicaManager) -> frozenset[TopicPartition]:
    """What the controller has still to do for this broker, as far as this broker can see."""
    cache = manager.cache
    states: dict[TopicPartition, LeaderAndIsr] = {}
    assignments: dict[TopicPartition, tuple[int, ...]] = {}
    for name in cache.topic_names():
        cached = cache.topic(name)
        if cached is None:
            continue
        for partition, replicas in cached.assignment.partitions.items():
            tp = TopicPartition(name, partition)
            state = cache.state(tp)
            if state is not None:
                states[tp] = state.leader_and_isr
                assignments[tp] = tuple(replicas)
    available = cache.brokers.keys() - manager.shutting_down - {manager.broker_id}
    return controlled_shutdown_pending(manager.broker_id, states, assignments, available)


async def controlled_shutdown(manager: ReplicaManager) -> bool:
    """SIGTERM, with ``controlled.shutdown.enable``: returns whether everything movable moved
    (False: Kafka's "proceeding to do an unclean shutdown as all the controlled shutdown attempts
    failed", or disabled, or never registered)."""
    config = manager.broker.config
    epoch = manager.zk.broker_epoch
    if epoch is None or not config.get_bool("controlled.shutdown.enable"):
        return False
    max_retries = config.get_int("controlled.shutdown.max.retries")
    backoff_s = config.get_int("controlled.shutdown.retry.backoff.ms") / 1000
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    log.info("starting controlled shutdown of broker %d", manager.broker_id)
    for attempt in range(1, max_retries + 1):
        try:
            # bounded: with ZooKeeper unreachable kazoo would wait for the session to expire
            await asyncio.wait_for(
                loop.run_in_executor(
                    None, manager.controller.shutdown_requests.request, manager.broker_id, epoch
                ),
                timeout=max(backoff_s, REQUEST_TIMEOUT_S),
            )
        except Exception:  # ZooKeeper unreachable: retry after the back-off, as Kafka does
            log.exception("controlled shutdown request %d failed", attempt)
            await asyncio.sleep(backoff_s)
            continue
        if await manager.wait_for_cache(lambda: not remaining(manager), backoff_s):
            log.info(
                "controlled shutdown succeeded after %d attempt(s) in %.3f s",
                attempt,
                time.monotonic() - started,
            )
            return True
        log.info(
            "controlled shutdown attempt %d: remaining partitions to move %s",
            attempt,
            sorted(str(tp) for tp in remaining(manager)),
        )
    log.warning("proceeding to do an unclean shutdown as all the controlled shutdown attempts failed")
    return False


def resign_leaderships(manager: ReplicaManager) -> None:
    """Leaving: stop leading what is still led here (what could not move), so its parked acks=all
    produces are answered NOT_LEADER_OR_FOLLOWER before the connections close rather than dropped
    with them, and its parked reads re-check."""
    for tp in list(manager.leaders):
        manager.role_changes += 1  # before the wake-ups below re-check parked follower fetches
        del manager.leaders[tp]
        manager.delayed_produces.wake(tp)
        manager.broker.waiters.notify(tp)
