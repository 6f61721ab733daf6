"""librdkafka clients kept across tasks of one Python worker (and across driver-side calls).

Creating a client, connecting and fetching metadata costs tens to hundreds of milliseconds - more
than reading or deciding a small micro-batch. Spark reuses its Python workers
(``spark.python.worker.reuse``, the default), so a worker can keep the clients whose only state is
what every use resets:

* **consumers that only assign()** (the source's readers, the progress-marker readers): no group
  membership, no committed offsets. A borrower gets one of them exclusively and gives it back
  unassigned; one that failed is closed instead.
* **the idempotent producer that appends decisions**: no transactions, every append flushed before
  it returns; librdkafka producers may be shared.

Never pooled: transactional producers. Their transactional.id must stay bound to one task, each
attempt's ``init_transactions`` is what fences the attempt before it, and in two-phase mode the
task's producer is fenced by its own prepare.

At most one idle client per (kind, configuration, thread). A client idle longer than
``IDLE_CLOSE_S`` is closed by a daemon thread that wakes every ``IDLE_CHECK_S`` (an idle consumer
of a broker that went away would otherwise retry its connection - and log about it - for the
worker's lifetime); a shared producer unused that long is closed the same way.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaException

# Defaults of every producer the connector creates (the user's ``kafka.*`` options override them).
#
# Eager connections: with librdkafka's default sparse connections, a new idempotent or
# transactional producer's producer-id look-up races the teardown of its bootstrap connection:
# when it runs while the bootstrap connection is still up but already being decommissioned, no
# connection to the broker the producer just learned is started, and the look-up waits for
# librdkafka's fixed 500 ms retry timer (otherwise for its 50 ms sparse-connect back-off).
# Measured against a local broker: ``init_transactions`` p50 55 ms with 13% of the calls at
# 505 ms, against 4 ms (max 12 ms) with eager connections. The sink makes a new transactional
# producer per task (its transactional.id is the task's), so this was on every micro-batch's path
# - twice per batch at two tasks, the ~1 s bimodal ``sink.prepare``. A producer writes to the
# partitions' leaders and talks to its coordinator anyway: connecting to every broker it learns
# costs nothing it would not pay.
PRODUCER_DEFAULTS: dict[str, Any] = {"enable.sparse.connections": False}

IDLE_CLOSE_S = 60.0
IDLE_CHECK_S = 10.0

_IDLE: dict[tuple[Any, ...], tuple[Any, float]] = {}
_SHARED: dict[tuple[Any, ...], tuple[Any, float]] = {}
_LOCK = threading.Lock()
_REAPER: list[threading.Thread] = []


def _reap_forever() -> None:
    while True:
        time.sleep(IDLE_CHECK_S)
        close_idle(time.monotonic() - IDLE_CLOSE_S)


def close_idle(before: float) -> int:
    """Close every pooled or shared client last used before ``before`` (monotonic); how many."""
    stale = []
    with _LOCK:
        for pool in (_IDLE, _SHARED):
            for key, (client, since) in list(pool.items()):
                if since < before:
                    stale.append(client)
                    del pool[key]
    for client in stale:
        _close(client)
    return len(stale)


def _ensure_reaper() -> None:
    """Called with ``_LOCK`` held."""
    if not _REAPER:
        thread = threading.Thread(target=_reap_forever, name="exactly-idle-clients", daemon=True)
        _REAPER.append(thread)
        thread.start()


def _key(kind: str, conf: dict[str, Any], per_thread: bool) -> tuple[Any, ...]:
    owner = threading.get_ident() if per_thread else 0
    return (kind, owner, *sorted((k, str(v)) for k, v in conf.items()))


def borrow(kind: str, conf: dict[str, Any], factory: Callable[[dict[str, Any]], Any]) -> tuple[Any, bool]:
    """(an idle client of this kind and configuration, or a new one; whether it was reused)."""
    with _LOCK:
        found = _IDLE.pop(_key(kind, conf, True), None)
    if found is not None:
        return found[0], True
    return factory(conf), False


def give_back(kind: str, conf: dict[str, Any], client: Any, healthy: bool) -> None:
    """Return a borrowed consumer: unassigned into the pool if healthy, else closed."""
    if healthy:
        try:
            client.unassign()
        except KafkaException:
            healthy = False
    if healthy:
        key = _key(kind, conf, True)
        with _LOCK:
            if key not in _IDLE:
                _IDLE[key] = (client, time.monotonic())
                _ensure_reaper()
                return
    _close(client)


def shared(kind: str, conf: dict[str, Any], factory: Callable[[dict[str, Any]], Any]) -> Any:
    """One client per (kind, configuration) in this process, created on first use."""
    key = _key(kind, conf, False)
    with _LOCK:
        found = _SHARED.get(key)
        client = found[0] if found is not None else factory(conf)
        _SHARED[key] = (client, time.monotonic())
        _ensure_reaper()
        return client


def drop_shared(kind: str, conf: dict[str, Any]) -> None:
    """Forget a shared client after it failed (the next ``shared`` creates a new one)."""
    with _LOCK:
        _SHARED.pop(_key(kind, conf, False), None)


def _close(client: Any) -> None:
    """Consumers close; a producer has no close - flushing what is left and dropping the last
    reference destroys it."""
    try:
        close = getattr(client, "close", None)
        if close is not None:
            close()
        else:
            client.flush(5)
    except (KafkaException, RuntimeError):
        pass
